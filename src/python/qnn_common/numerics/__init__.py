"""Numbers computed from arrays with numpy: how far an approximation is from its reference
(`metrics`) and how a causal LM's next-token distributions differ from a reference's
(`lm_metrics`). Not at qnn_common's top level, which holds the standard-library-only contracts."""

"""The host side of a causal LM's exported programs, with torch: driving its prefill and decode
methods (`steps`) and reading the tables its artifacts carry (`tables`). The contract types every
stage and config reads, without torch, are `qnn_common.llm_spec`."""

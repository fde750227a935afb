"""`qnn-pipeline tune`: the mixed recipe that meets a budget, found and verified.

A search over per-layer recipes (`quantize.layer_recipes`): every linear layer group of a causal
LM (a decoder block's attention projections, its MLP, the head) at a cheap recipe or promoted to
a richer one. The sensitivity pass (`sensitivity`) ranks the groups by what promoting each alone
buys in KL divergence from the float model, per byte it costs; the search (`search`) promotes
them in that order and verifies each candidate it stops at by quantizing it for real and scoring
its fake-quantized model; the front (`front`) is what it verified, and the winner a TOML file
`qnn-pipeline --config` rebuilds. `run` ties it to the pipeline's cached stages, so a killed
search resumes where it was.
"""

"""Whether a quantized causal LM is good: the float model, the fake-quantized model and the
program scored on the same tokens (docs/eval.md).

* `data`: the shipped corpus, prompt suite and task items, and the user's `--eval-file`.
* `lm`: a language model as the harness sees it (`StepLm`: prefill and decode steps), its
  teacher-forced logits and greedy replies.
* `corpus`, `prompts`, `tasks`: the three measurements, each against the float model.
* `report`: the figures as JSON, eval.md, and the gate's verdict.
"""

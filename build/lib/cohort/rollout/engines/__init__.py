"""The rollout engines, one module each, all speaking the request protocol of cohort/rollout/base.py: vLLM in-process
(vllm.py), transformers (hf.py, its continuous batching in hf_continuous.py) and a rollout server over HTTP (remote.py).
Which one a run uses is chosen in cohort/trainer/engines.py."""

"""The rollout engines, one module each, all speaking the request protocol of cohort/rollout/base.py: vLLM in-process
(vllm.py), transformers (hf.py, its continuous batching in hf_continuous.py); the rollout server's client is cohort/rollout/server/client.py.
Which one a run uses is chosen in cohort/trainer/build_engine.py."""

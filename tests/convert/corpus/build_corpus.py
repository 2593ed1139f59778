import json, subprocess, pathlib, sys
ROOT = pathlib.Path(__file__).resolve().parent  # tests/convert/corpus
MIRRORS = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "/work/.mirror")  # git clones named owner+name/repo
VERL = str(MIRRORS / "volcengine+verl/repo")
TRL = str(MIRRORS / "huggingface+trl/repo")
OR1 = str(MIRRORS / "huggingface+open-r1/repo")
def rev(repo, r): return subprocess.check_output(["git", "-C", repo, "rev-parse", r], text=True).strip()
VH, VR = rev(VERL, "HEAD"), "246cac4ca6b0e3ce1009bc48aaa798689e0600af"
TH = rev(TRL, "HEAD"); TOLD = rev(TRL, "208e9f7df^")
OH = rev(OR1, "HEAD")
items = []
def add(peer, repo, url, commit, path, name=None, lines=None, note=""):
    text = subprocess.check_output(["git", "-C", repo, "show", f"{commit}:{path}"], text=True)
    if lines:
        a, b = lines
        text = "\n".join(text.splitlines()[a - 1:b]) + "\n"
    name = name or path.replace("/", "__")
    out = ROOT / peer / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    items.append({"file": f"{peer}/{name}", "repo": url, "path": path, "commit": commit, "licence": "Apache-2.0",
                  **({"lines": f"{lines[0]}-{lines[1]}"} if lines else {}), **({"note": note} if note else {})})
V = "volcengine/verl"
for p in """examples/grpo_trainer/run_qwen2-7b.sh
examples/grpo_trainer/run_qwen2-7b_math.sh
examples/grpo_trainer/run_deepseek7b_llm.sh
examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh
examples/grpo_trainer/run_qwen3-8b.sh
examples/grpo_trainer/run_qwen2-7b_seq_balance.sh
examples/grpo_trainer/run_deepseek7b_llm_math.sh
examples/ppo_trainer/run_deepseek7b_llm.sh
examples/ppo_trainer/run_qwen2-7b_rm.sh
examples/ppo_trainer/run_gemma.sh
examples/ppo_trainer/run_qwen2-7b_seq_balance.sh
examples/ppo_trainer/run_deepseek_full_hh_rlhf.sh
examples/ppo_trainer/run_qwen2.5-32b.sh
examples/rloo_trainer/run_qwen2-7b.sh
examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh
examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf_baseline.sh
examples/remax_trainer/run_qwen2.5-3b_seq_balance.sh
examples/gspo_trainer/test_gspo_3b_math.sh
examples/gspo_trainer/run_qwen30b_gspo.sh
examples/gspo_trainer/test_gspo_3b_math_slurm.sh
examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh
examples/gmpo_trainer/run_qwen2_5-7b_math.sh
examples/gmpo_trainer/test_dapo_7b_math.sh
examples/gpg_trainer/run_qwen2-7b_math.sh
examples/sapo_trainer/run_qwen30b_sapo.sh
examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh
examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_vllm_fsdp.sh
examples/tuning/0.5b/qwen2-0.5b_grpo-lora_1_h100_fsdp_vllm.sh
examples/tuning/70b/qwen2-70b_grpo_32_h20_fsdp_vllm.sh
examples/tuning/7b/qwen2-7b_grpo_2_h800_fsdp_vllm.sh
examples/rollout_correction/run_with_rollout_corr.sh""".split():
    add("verl", VERL, V, VH, p)
for p in """recipe/dapo/run_dapo_qwen2.5_32b.sh
recipe/dapo/test_dapo_7b_math.sh
recipe/dapo/test_dapo_7b.sh
recipe/dapo/run_dapo_wo_ds_qwen2.5_32b.sh
recipe/dapo/run_dapo_early_qwen2.5_32b.sh
recipe/dapo/test_dapo_7b_math_lora.sh
recipe/entropy/7b_clip_cov.sh""".split():
    add("verl", VERL, V, VR, p, note="recipe/ as it was before verl moved it to verl-recipe (commit 2bb42bae6)")
T = "huggingface/trl"
add("trl", TRL, T, TH, "examples/scripts/gspo.py", "gspo_usage.sh", (31, 50), "the usage command in the module docstring")
add("trl", TRL, T, TOLD, "examples/scripts/grpo_vlm.py", "grpo_vlm_qwen_usage.sh", (31, 45), "the first usage command in the module docstring (before TRL renamed torch_dtype to dtype)")
add("trl", TRL, T, TOLD, "examples/scripts/grpo_vlm.py", "grpo_vlm_smolvlm_usage.sh", (50, 64), "the second usage command in the module docstring (before TRL renamed torch_dtype to dtype)")
add("trl", TRL, T, TH, "docs/source/clis.md", "clis_grpo.sh", (60, 63), "the GRPO command of the CLI page")
add("trl", TRL, T, TH, "docs/source/clis.md", "clis_grpo_num_processes.sh", (274, 278), "the GRPO command under Scaling Up with Accelerate")
add("trl", TRL, T, TH, "docs/source/clis.md", "clis_grpo_config.yaml", (284, 289), "the GRPO config file under Scaling Up with Accelerate")
O = "huggingface/open-r1"
for c, p in [(OH, "recipes/DeepSeek-R1-Distill-Qwen-1.5B/grpo/config_demo.yaml"),
             (OH, "recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml"),
             (OH, "recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo_code.yaml"),
             (OH, "recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo_code_ioi.yaml"),
             (OH, "recipes/Qwen2.5-Coder-7B-Instruct/grpo/config_codeforces.yaml"),
             ("698530484c34ce704d70ce97df12f790def7148f", "recipes/DeepSeek-R1-Distill-Qwen-7B/grpo/config_demo.yaml"),
             ("068f13f236e4fe70e0881efa25c69e1c1df2607a", "recipes/Qwen2.5-7B-Instruct/grpo/config_demo.yaml"),
             ("9eef995b4d9a3df5cbf98641efae12609d0267c2", "recipes/Qwen2.5-Math-7B/grpo/config_simple_rl.yaml"),
             ("dd915f8483f79ccd40f65588c778c7f126bf021c", "recipes/deepseek/DeepSeek-R1-Distill-Qwen-7B/grpo/config_full.yaml"),
             ("dd915f8483f79ccd40f65588c778c7f126bf021c", "recipes/qwen/Qwen2.5-1.5B-Instruct/grpo/config_full.yaml")]:
    add("open-r1", OR1, O, rev(OR1, c), p)
(ROOT / "manifest.json").write_text(json.dumps(items, indent=1) + "\n")
print(len(items))

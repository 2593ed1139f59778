"""verl's algorithm and reward options mapped to cohort's: the estimator, the policy loss and its clip ranges,
the reward manager (DAPO's overlong buffer), the reward model and dynamic sampling. Rules for cohort.mapping.verl_rules.

Each verl choice maps to the cohort field that does the same thing, or is refused by name with the reason:
- `algorithm.adv_estimator`: grpo, rloo, reinforce_plus_plus(_baseline), gae (PPO); remax, gpg, opo, grpo_passk
  and the optimal-token baselines are refused. verl's rloo trains with its policy loss's *token* ratio, where
  cohort's rloo defaults to TRL's sequence ratio: the conversion sets `algorithm.importance_sampling_level=token`.
- `actor.policy_loss.loss_mode`: vanilla (token ratio, verl's dual clip `clip_ratio_c`=3 by default), gspo
  (sequence ratio), cispo (`loss_type=cispo`: verl clamps the IS weight to [1 − low, 1 + high], cohort caps it at
  `epsilon_high` itself, so `epsilon_high = 1 + clip_ratio_high`; a lower clamp above 0 has no counterpart),
  geo_mean (`loss_type=gmpo`: the clip ranges bound the log-ratio), sapo (`loss_type=sapo`, tau_pos/tau_neg);
  clip_cov, kl_cov, gpg and bypass_mode are refused.
- `reward_model.reward_manager`: naive (the score as it is), dapo (the score plus, with the overlong buffer,
  `soft_overlong` weighted by its penalty factor: the same linear ramp to −factor over the buffer's last tokens);
  others refused. `reward_model.enable=True` trains on a reward model's score: cohort's `reward_model` reward.
- `algorithm.filter_groups.*` (DAPO's dynamic sampling): `pipeline.dynamic_sampling`.

Defaults carried where verl's differ and the script selects them: `algorithm.lam=1.0` and
`critic.cliprange_value=0.5` for PPO (gae), `clip_ratio_c=3.0` with the vanilla loss (cohort's dual clip is off
by default), `kl_loss_coef=0.001` when `use_kl_loss=True` leaves it unset.
"""

from __future__ import annotations

from typing import Any

from cohort.mapping.rules import Entry, Options, Unmappable, flow

AR = "actor_rollout_ref."
ACTOR = AR + "actor."
ESTIMATOR, LOSS_MODE, AGG = "algorithm.adv_estimator", ACTOR + "policy_loss.loss_mode", ACTOR + "loss_agg_mode"
LOW, HIGH, BOTH = ACTOR + "clip_ratio_low", ACTOR + "clip_ratio_high", ACTOR + "clip_ratio"
RM = "reward_model."

ESTIMATORS = {"grpo": "grpo", "grpo_vectorized": "grpo", "rloo": "rloo", "rloo_vectorized": "rloo",
              "reinforce_plus_plus": "reinforce_pp", "reinforce_plus_plus_baseline": "reinforce_pp_baseline",
              "gae": "ppo"}
REFUSED_ESTIMATORS = {
    "remax": "ReMax's baseline is a second, greedy rollout per prompt, which cohort does not generate; rloo or grpo "
             "use the group instead",
    "gpg": "GPG's loss and its batch-level correction have no counterpart",
    "opo": "OPO's length-weighted baseline has no counterpart",
    "grpo_passk": "pass@k advantages have no counterpart",
    "optimal_token_baseline": "the optimal token baseline has no counterpart",
    "tir_optimal_token_baseline": "the optimal token baseline has no counterpart",
}
AGGREGATIONS = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}
LOSS_MODE_LOSS = {"cispo": "cispo", "geo_mean": "gmpo", "sapo": "sapo"}  # loss modes with a cohort loss_type
LOSS_MODE_AGG = {"cispo": "token-mean", "sapo": "seq-mean-token-mean"}  # the aggregation cohort's entry fixes
REFUSED_LOSS_MODES = {
    "clip_cov": "Clip-Cov (clipping by the covariance of log-prob and advantage) has no counterpart",
    "kl_cov": "KL-Cov (a KL penalty on high-covariance tokens) has no counterpart",
    "gpg": "GPG's loss has no counterpart",
    "bypass_mode": "verl's rollout-correction bypass has no counterpart; algorithm.rollout_correction weights the "
                   "engine's log-probs instead",
}


def estimator(value: str, o: Options) -> list[Entry]:
    if value in REFUSED_ESTIMATORS:
        raise Unmappable(f"{value}: {REFUSED_ESTIMATORS[value]}")
    if value not in ESTIMATORS:
        raise Unmappable(f"{flow(value)} has no cohort counterpart (algorithm.name: grpo, rloo, reinforce_pp, "
                         "reinforce_pp_baseline, ppo)")
    out = [Entry("algorithm.name", ESTIMATORS[value], o.show(ESTIMATOR) + (" (PPO with a critic)" if value == "gae" else ""))]
    if ESTIMATORS[value] == "rloo" and o.get(LOSS_MODE) == "vanilla":
        out.append(Entry("algorithm.importance_sampling_level", "token", f"{o.show(ESTIMATOR)} with {o.show(LOSS_MODE)}: "
                         "verl's rloo trains with the token-level ratio (cohort's rloo defaults to TRL's sequence ratio)"))
    return out


def loss_mode(value: str, o: Options) -> list[Entry]:
    if value in REFUSED_LOSS_MODES:
        raise Unmappable(f"{value}: {REFUSED_LOSS_MODES[value]}")
    if value == "vanilla":
        if ESTIMATORS.get(o.get(ESTIMATOR)) == "rloo" or not o.has(LOSS_MODE):
            return []  # (the estimator's line names it, or verl's default: cohort's token ratio too)
        return [Entry("algorithm.importance_sampling_level", "token", o.show(LOSS_MODE) + ": PPO clipping of token ratios")]
    if value == "gspo":
        return [Entry("algorithm.importance_sampling_level", "sequence", o.show(LOSS_MODE) + ": the sequence ratio "
                      "(geometric mean of the token ratios)")]
    if value not in LOSS_MODE_LOSS:
        raise Unmappable(f"{flow(value)} has no cohort counterpart (vanilla, gspo, cispo, geo_mean, sapo map)")
    agg = o.get(AGG)
    fixed = LOSS_MODE_AGG.get(value)
    if fixed is not None and agg != fixed:
        raise Unmappable(f"{value} with {o.show(AGG)}: cohort's loss_type={LOSS_MODE_LOSS[value]} aggregates "
                         f"{fixed} (TRL's form); set {AGG}={fixed} or convert to another loss")
    how = f", {o.show(AGG)}" if fixed else f" (verl's geo_mean averages per sequence and ignores {o.show(AGG)})"
    out = [Entry("algorithm.loss_type", LOSS_MODE_LOSS[value], o.show(LOSS_MODE) + how)]
    return out + _loss_parameters(value, o)


def _clip(o: Options, key: str) -> float:
    return o.get(key) if o.has(key) else o.get(BOTH, 0.2)


def _loss_parameters(value: str, o: Options) -> list[Entry]:
    low, high = _clip(o, LOW), _clip(o, HIGH)
    shown = ", ".join(o.show(k) for k in (BOTH, LOW, HIGH) if o.has(k)) or f"{BOTH}=0.2 (verl's default)"
    if value == "cispo":
        if 1 - low > 0:
            raise Unmappable(f"verl's cispo clamps the IS weight below at 1 − {low} = {1 - low:g}; cohort's cispo has no "
                             "lower bound (MiniMax's and TRL's form): set clip_ratio_low ≥ 1 for the same run")
        return [Entry("algorithm.epsilon_high", 1 + high, f"{shown}: verl clamps the IS weight to [1 − low, 1 + high] = "
                      f"[{1 - low:g}, {1 + high:g}]; cohort's cispo caps it at epsilon_high itself (TRL's meaning): "
                      f"1 + {high} = {1 + high:g}, no lower bound (1 − low ≤ 0 bounds nothing)")]
    if value == "geo_mean":
        return [Entry("algorithm.epsilon_low", low, f"{shown}: GMPO bounds the token log-ratio to [−low, high]"),
                Entry("algorithm.epsilon_high", high, f"{shown}: GMPO bounds the token log-ratio to [−low, high]")]
    return [Entry(f"algorithm.sapo_temperature_{side}", o.get(f"{ACTOR}tau_{side}"), o.show(f"{ACTOR}tau_{side}"))
            for side in ("pos", "neg")]


def named_by_loss_mode(inner, *, clip: bool):
    """A clip-range (`clip`) or aggregation rule whose meaning belongs to the loss mode's lines when the mode is not
    PPO's; verl's sapo reads no clip range."""

    def convert(value: Any, o: Options) -> list[Entry]:
        mode = o.get(LOSS_MODE)
        if mode == "sapo" and clip:
            raise Unmappable("no effect in verl: its sapo loss gates the ratio softly and reads no clip range")
        if mode in LOSS_MODE_LOSS:
            return []  # (named on the loss mode's lines)
        if mode in REFUSED_LOSS_MODES and mode != "bypass_mode":
            raise Unmappable(f"a parameter of {LOSS_MODE}={mode}, which has no counterpart")
        return inner(value, o)

    return convert


def sapo_temperature(value: float, o: Options) -> list[Entry]:
    if o.get(LOSS_MODE) == "sapo":
        return []  # (named on the loss mode's lines)
    raise Unmappable(f"read only by {LOSS_MODE}=sapo")


def dual_clip(value: float, o: Options) -> list[Entry]:
    if o.get(LOSS_MODE) != "vanilla":
        if not o.has(ACTOR + "clip_ratio_c"):
            return []
        raise Unmappable(f"no effect in verl: only the vanilla policy loss applies the dual clip ({o.show(LOSS_MODE)})")
    return [Entry("algorithm.clip_ratio_c", value, o.show(ACTOR + "clip_ratio_c") + ": the dual clip for negative "
                  "advantages (verl applies it always; cohort only when set)")]


def aggregation(value: str, o: Options) -> list[Entry]:
    if value not in AGGREGATIONS:
        raise Unmappable(f"{flow(value)} has no cohort counterpart (algorithm.loss_type: "
                         + ", ".join(f"{k} → {v}" for k, v in AGGREGATIONS.items()) + ")")
    return [Entry("algorithm.loss_type", AGGREGATIONS[value], o.show(AGG))]


def when_ppo(field: str, key: str, what: str):
    """verl's own default of a PPO-only option, carried when the script runs PPO (gae) and cohort's differs."""

    def convert(value: Any, o: Options) -> list[Entry]:
        if o.get(ESTIMATOR) != "gae":
            if not o.has(key):
                return []
            raise Unmappable(f"read only by PPO ({ESTIMATOR}=gae); this script runs {o.get(ESTIMATOR)}")
        return [Entry(field, value, f"{o.show(key)}: {what}")]

    return convert


# -- rewards -----------------------------------------------------------------------------------

OVERLONG = (RM + "overlong_buffer.", RM + "reward_kwargs.overlong_buffer_cfg.")


def _overlong(o: Options, name: str) -> Any:
    for prefix in OVERLONG:
        if o.has(prefix + name):
            return o.get(prefix + name)
    return {"enable": False, "len": 0, "penalty_factor": 1.0}[name]


def _overlong_keys(o: Options) -> list[str]:
    return [prefix + k for prefix in OVERLONG for k in ("enable", "len", "penalty_factor", "log") if o.has(prefix + k)]


def _base_reward(o: Options) -> tuple[dict[str, Any], str]:
    path = o.get("custom_reward_function.path")
    if path:
        name = o.get("custom_reward_function.name")
        module = path.rsplit("/", 1)[-1].removesuffix(".py")
        folder = path.rsplit("/", 1)[0] if "/" in path else "."
        return {"name": f"{module}:{name}"}, (f"custom_reward_function.path={path}, {o.show('custom_reward_function.name')}: "
                                            f"put {folder} on PYTHONPATH (verl's compute_score contract is read as is)")
    return {"name": "verl_default"}, ("verl's default scorer (custom_reward_function.path unset): default_compute_score by "
                                      "data_source (GSM8K, MATH, DAPO's math_dapo and aime*)")


def rewards(value: Any, o: Options) -> list[Entry]:
    """The `rewards` list: a reward model, or the rule-based score (custom or default) plus DAPO's overlong penalty."""
    if o.get(RM + "enable"):
        path = o.get(RM + "model.path")
        if not path:
            raise Unmappable(f"{RM}enable=True without {RM}model.path: name the reward model's checkpoint")
        spec = {"name": "reward_model", "model": path}
        if o.has(RM + "micro_batch_size_per_gpu"):
            spec["batch_size"] = o.get(RM + "micro_batch_size_per_gpu")
        return [Entry("rewards", [spec], f"{o.show(RM + 'enable')}, {o.show(RM + 'model.path')}: the reward model's "
                      "score is the reward (verl then ignores the rule-based one); scored on the reward's `device` "
                      "(cpu unless set)" + (f", {o.show(RM + 'micro_batch_size_per_gpu')}" if "batch_size" in spec else ""))]
    manager = o.get(RM + "reward_manager")
    if manager not in ("naive", "dapo"):
        raise Unmappable(f"{RM}reward_manager={manager}: cohort scores like verl's naive (one score per completion) "
                         "and dapo (plus the overlong penalty) managers only")
    base, text = _base_reward(o)
    specs, shown = [base], [text] + ([o.show(RM + "reward_manager")] if o.has(RM + "reward_manager") else [])
    if manager == "dapo" and _overlong(o, "enable"):
        length, factor = _overlong(o, "len"), _overlong(o, "penalty_factor")
        max_key = RM + "reward_kwargs.max_resp_len" if o.has(RM + "reward_kwargs.max_resp_len") else "data.max_response_length"
        maximum = o.get(max_key)
        specs.append({"name": "soft_overlong", "max_completion_length": maximum, "cache_length": length, "weight": factor})
        shown.append(", ".join(o.show(k) for k in _overlong_keys(o) if not k.endswith("log")) +
                     f", {o.show(max_key)}: DAPO's overlong penalty, 0 up to {maximum - length} "
                     f"tokens then linear down to −{factor:g} at {maximum}")
    elif manager != "dapo" and _overlong_keys(o):
        raise Unmappable(f"the overlong buffer is read only by {RM}reward_manager=dapo")
    return [Entry("rewards", specs, "; ".join(shown))]


def dynamic_sampling(value: bool, o: Options) -> list[Entry]:
    if not value:
        return [Entry("pipeline.dynamic_sampling", False, o.show("algorithm.filter_groups.enable"))]
    metric = o.get("algorithm.filter_groups.metric", "acc")
    rounds = o.get("algorithm.filter_groups.max_num_gen_batches", 0)
    out = [Entry("pipeline.dynamic_sampling", True, f"{o.show('algorithm.filter_groups.enable')}, "
                 f"{o.show('algorithm.filter_groups.metric')}: a group whose rewards are all equal is replaced (cohort "
                 f"compares the summed reward; verl's {metric} differs from it only where the overlong penalty splits "
                 "a group that is all right or all wrong)")]
    if rounds and rounds > 0:
        out.append(Entry("pipeline.max_refill_rounds", rounds - 1, f"{o.show('algorithm.filter_groups.max_num_gen_batches')}"
                         f" generation rounds per step = the first + {rounds - 1} refill rounds"))
    return out


def gen_batch_size(value: int, o: Options) -> list[Entry]:
    if o.get("algorithm.filter_groups.enable"):
        raise Unmappable(f"verl generates {value} prompts per round and keeps {o.get('data.train_batch_size')}; cohort "
                         "requests replacement groups one by one as dynamic sampling drops them (pipeline.dynamic_sampling)")
    raise Unmappable("without filter_groups verl generates data.train_batch_size prompts per step; no effect here")

"""TRL's batch units turned into cohort's (the rules of cohort/mapping/trl_rules.py that need arithmetic): completions
per optimizer step, prompts per step, micro-batches, steps per generation, the generation batch, epochs and max_steps.

Units, where a port usually goes wrong (trl_rules.py's docstring says the same, rule by rule): TRL counts completions
per device and micro-steps; cohort counts prompts per optimizer step and optimizer steps per generation.
"""

from __future__ import annotations

from cohort.mapping.rules import Entry, Options, Unmappable, steps_for_epochs, whole

PD, GA, G = "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations"


def completions_per_step(o: Options) -> tuple[int, str]:
    """(completions per optimizer step, its arithmetic): per_device × processes × accumulation."""
    total = o.get(PD) * o.num_processes * o.get(GA)
    return total, f"{o.show(PD)} × {o.num_processes} process(es) × {o.show(GA)} = {total} completions"


def generation_completions(o: Options) -> int:
    """Completions per generation batch, as TRL derives it."""
    if o.get("generation_batch_size") is not None:
        return o.get("generation_batch_size")
    micro = o.get("steps_per_generation") or o.get(GA)
    return o.get(PD) * o.num_processes * micro


def _prompts_per_step(value: int, o: Options) -> list[Entry]:
    total, text = completions_per_step(o)
    if total % o.get(G):
        raise Unmappable(f"{text} per optimizer step is not a whole number of groups of {o.show(G)}; TRL refuses that "
                         f"too, so this config runs on other processes than {o.num_processes}: give accelerate's "
                         "processes (`cohort convert --num-processes N`, or num_processes in the config)")
    prompts = whole(total / o.get(G), f"completions per optimizer step / {G} = {total} / {o.get(G)}")
    return [Entry("train.prompts_per_step", prompts, f"{text} per optimizer step / {o.show(G)} = {prompts} prompts")]


def _micro_batch(value: int, o: Options) -> list[Entry]:
    return [Entry("train.micro_batch_size", value, f"{o.show(PD)} completions per forward/backward pass (per process)")]


def _steps_per_generation(value: int | None, o: Options) -> list[Entry]:
    if value is None:
        return []
    if o.get("generation_batch_size") is not None:
        raise Unmappable("TRL refuses steps_per_generation together with generation_batch_size")
    steps = whole(value / o.get(GA), f"steps_per_generation / {GA} = {value} / {o.get(GA)}")
    return [Entry("train.steps_per_generation", steps, f"{o.show('steps_per_generation')} micro-steps / {o.show(GA)} = "
                  f"{steps} optimizer steps per generation batch")]


def _generation_batch(value: int | None, o: Options) -> list[Entry]:
    if value is None:
        return []
    total, text = completions_per_step(o)
    if value % total:
        raise Unmappable(f"{value} completions is not a whole number of optimizer steps of {text}: cohort trains whole "
                         f"steps from a generation batch; use a multiple of {total}")
    return [Entry("rollout.generation_batch_size", value, f"{o.show('generation_batch_size')} completions in both "
                  f"({value} / {total} = {value // total} optimizer steps per generation batch)")]


def _epochs(value: float, o: Options) -> list[Entry]:
    if (o.get("max_steps") or -1) > 0:
        if o.has("num_train_epochs"):
            raise Unmappable("max_steps is set, and TRL then ignores num_train_epochs")
        return []
    per_step, _ = completions_per_step(o)
    gen = generation_completions(o)
    prompts = whole(gen / o.get(G), f"generation batch / {G} = {gen} / {o.get(G)}")
    k = whole(gen / per_step, f"generation batch / completions per step = {gen} / {per_step}") * o.get("num_iterations")
    text = f"({gen} / {per_step} optimizer steps per generation batch × {o.show('num_iterations')})"
    out = steps_for_epochs("num_train_epochs", o, prompts, k, text)
    return [Entry(e.field, e.value, e.comment + (f", {o.show('max_steps')}" if o.has("max_steps") else "")) for e in out]


def _max_steps(value: int, o: Options) -> list[Entry]:
    if value is None or value <= 0:
        return []  # (num_train_epochs decides; its line names this one)
    return [Entry("train.max_steps", value, o.show("max_steps") + " optimizer steps in both")]


def _total_steps(o: Options) -> int | None:
    if (o.get("max_steps") or -1) > 0:
        return o.get("max_steps")
    try:
        return _epochs(o.get("num_train_epochs"), o)[0].value
    except (Unmappable, IndexError):
        return None

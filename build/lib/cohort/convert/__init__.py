"""`cohort convert`: a verl `main_ppo` (or recipe) launch script or command line, or a TRL GRPO config or
`trl grpo` / `accelerate launch` command, rewritten as a cohort YAML.

The mapping itself is data, in cohort.mapping (one table of rules per source). This
package reads the inputs (`shell`: a script as bash reads what it sets; `sources`: the
trainer's command in it, arguments, YAML or JSON), applies a table and checks the result
against cohort's config and `cohort plan`'s checks (`core`), and writes the tables into
docs/migrating.md (`docs`).

Left out: verl's Hydra YAML files (`--config-name`) and TRL's other trainers; a key
neither table knows is listed as not mapped, never dropped.
"""

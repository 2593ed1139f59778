"""`cohort convert`: a verl `main_ppo` command line or a TRL GRPO config, rewritten as a cohort YAML.

The mapping itself is data, in cohort.mapping (one table of rules per source). This
package reads the inputs (`sources`: a shell script, arguments, YAML or JSON),
applies a table and checks the result against cohort's config (`core`), and writes
the tables into docs/migrating.md (`docs`).

Left out: verl's Hydra YAML files (`--config-name`) and TRL's other trainers; a key
neither table knows is listed as not mapped, never dropped.
"""

"""`cohort convert`: a verl `main_ppo` command line or a TRL GRPO config, rewritten as a cohort YAML.

The mapping is data: one table of `Rule`s per source (`verl_rules.VERL_RULES`,
`trl_rules.TRL_RULES`), each naming the source key, the cohort fields it sets,
the function that converts its value (units included) and a note. The same
tables generate the mapping tables of docs/migrating.md (`cohort.convert.docs`)
and the one-line hint `cohort train` gives when a verl or TRL key is written
where a cohort key belongs (`hints.foreign_key_hint`, called by cohort.config).

Modules: `rules` (the types and the plain converters), `verl_rules` and
`trl_rules` (the tables), `hints` (the lookup cohort.config uses; it and the
tables import nothing of cohort, so `import cohort.config` stays light),
`sources` (reading a shell script, arguments, YAML or JSON), `core` (applying a
table, checking the result against cohort's config, writing the YAML) and `docs`.

Left out: verl's Hydra YAML files (`--config-name`) and TRL's other trainers;
a key neither table knows is listed as not mapped, never dropped.
"""

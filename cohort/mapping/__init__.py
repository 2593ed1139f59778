"""verl's and TRL's options mapped to cohort's fields, as data: one table of `Rule`s per source.

`rules` holds the types and the plain converters, `verl_rules.VERL_RULES` (with
the algorithm and reward converters of `verl_algorithms`) and `trl_rules.TRL_RULES`
(with open-r1's own options, `open_r1_rules`) the tables (source key, cohort fields,
converter with the unit arithmetic, note), `hints.foreign_key_hint` the one-line cohort spelling of a
foreign key. The package imports nothing else of cohort, so cohort.config can name
cohort's spelling when it refuses a verl or TRL key; `cohort convert`
(cohort.convert) applies the tables to a whole script or config, and
cohort.convert.option_tables writes them into docs/migrating.md.
"""

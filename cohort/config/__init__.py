"""cohort's configuration, the bottom layer: the typed sections (schema.py), loading them from YAML, a dict and
dotted overrides (resolve.py), old field names read as new ones (renames.py), the field table behind `--help` and
the reference (fields.py), the embedded demo's preset (demo.py), and the two small pieces of data the layers above
read from a config: a Python object's saved name (references.py, which the rewards registry reads too) and the
rollout scheduler's admission rules (admission.py: the batch plan carries them, the scheduler takes them).

Imports pydantic, yaml and `cohort.mapping`'s tables (pure data: an unknown key that is verl's or TRL's name is
refused with cohort's spelling), nothing else of cohort and never torch; so data/, models/, rewards/ and rollout/
take their typed section from here. Every check across fields is above (cohort/plan/).

`from cohort.config import CohortConfig, load_config` is the public spelling; the names below are the package's API.
"""

from cohort.config.admission import AdmissionRules
from cohort.config.resolve import ResolvedConfig, load_config, merge, parse_override, read_yaml, resolve_config
from cohort.config.schema import (SECTIONS, AgentConfig, AlgorithmConfig, CohortConfig, ConfigError, CriticConfig, DataConfig,
                                  DistributedConfig, EngineConfig, LoraConfig, ModelConfig, PipelineConfig, RewardSpec,
                                  RolloutConfig, RunConfig, TeacherConfig, ToolsConfig, TrainConfig, default_output_dir)

__all__ = [
    "SECTIONS", "AdmissionRules", "AgentConfig", "AlgorithmConfig", "CohortConfig", "ConfigError", "CriticConfig", "DataConfig", "DistributedConfig",
    "EngineConfig", "LoraConfig", "ModelConfig", "PipelineConfig", "ResolvedConfig", "RewardSpec", "RolloutConfig", "RunConfig",
    "TeacherConfig", "ToolsConfig", "TrainConfig", "default_output_dir", "load_config", "merge", "parse_override", "read_yaml",
    "resolve_config",
]

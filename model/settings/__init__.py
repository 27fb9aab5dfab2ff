"""The run's configuration (torch-free: the launcher checks a run's config with it).

config          TrainConfig: typed fields, YAML files and key=value overrides, validation
config_values   values as they arrive (YAML mappings, key=value strings) made into typed fields
health_config   the health.* keys: per-layer statistics, the step guard, its test fault
intel_layout    the Intel guides' gpt2_train_cfg.yaml layout, translated onto our keys
shape_rules     what each field of a GPT-2 model shape allows, as data
"""

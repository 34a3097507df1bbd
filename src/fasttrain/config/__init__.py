"""What a config may say, and the one-line errors when it says something else.

errors.py     UserError / ConfigError: every check raises them; fasttrain.cli prints one line
schema.py     validate(cfg): every `_target_` node against its class's signature
domains.py    value domains declared in signatures: `lr: Annotated[float, Positive]`
settings.py   the top-level keys of each entry config, as typed signatures with range checks
overrides.py  the command line composed and checked before Hydra writes anything
explain.py    Hydra's composition errors as one line naming the override and what is valid
project.py    the project's conf/ (CONFIG_DIR) and paths as messages show them
resolvers.py  the resolvers conf/ interpolates: a run's name, its folders, the monitor
"""

from fasttrain.config import resolvers as _resolvers  # noqa: F401  registers conf/'s resolvers

"""The entry points' own `--help`: the groups from conf/ and the composed config, composed once
(Hydra's help copies its config repository once per group it lists)."""

from __future__ import annotations

import sys
from pathlib import Path

from fasttrain.config.project import CONFIG_DIR


def config_groups(root: Path = Path(CONFIG_DIR)) -> dict[str, list[str]]:
    """{"model/net": ["mlp", "small_cnn"], ...}: each folder with YAML files is a group."""
    groups: dict[str, list[str]] = {}
    for file in sorted(root.rglob("*.yaml")):
        group = file.parent.relative_to(root).as_posix()
        # hydra/ is Hydra's own; _shared/ holds pieces other configs merge in, not options
        if group != "." and group != "hydra" and not group.startswith("_"):
            groups.setdefault(group, []).append(file.stem)
    return groups


def print_app_help(config_name: str, argv: list[str]) -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    overrides = [a for a in argv if not a.startswith("-")]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name, overrides=overrides)
    entry = Path(sys.argv[0]).name
    lines = [f"{entry}: fasttrain, configured by Hydra.", "", "== Configuration groups ==",
             "Compose your configuration from those groups (group=option)", ""]  # fmt: skip
    lines += [f"{group}: {', '.join(opts)}" for group, opts in config_groups().items()]
    lines += ["", "== Config ==", "Override anything in the config (foo.bar=value)", ""]
    lines.append(OmegaConf.to_yaml(cfg))
    lines.append("Hydra's own options: --hydra-help")
    print("\n".join(lines))

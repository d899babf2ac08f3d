"""`run`'s command line checked before Hydra reads it: what Hydra would report with a traceback or without naming the
culprit (an override it cannot parse, a word that is neither an override nor a script, a YAML file of the user's
config folder that is not YAML)."""

from __future__ import annotations

from pathlib import Path

from runner.app.script_shorthand import HYDRA_INFO, HYDRA_VALUE_FLAGS


def _config_dir(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith(("--config-dir=", "-cd=")):
            return a.split("=", 1)[1]
        if a in ("--config-dir", "-cd") and i + 1 < len(argv):
            return argv[i + 1]
    return None


def input_problems(argv: list[str]) -> list[str]:
    """What Hydra would report with a traceback or without naming the culprit: an override it cannot
    parse, a YAML file of the user's config folder that is not YAML."""
    import yaml
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    found = []
    parser = OverridesParser.create()
    previous = None
    for a in argv:
        flag, previous = previous, a
        if flag in HYDRA_VALUE_FLAGS and (flag not in ("--info", "-i") or a in HYDRA_INFO):
            continue  # a flag's value (--cfg job): Hydra reads those
        if not a.startswith(("-", "~", "+")) and "=" not in a:
            found.append(f"error: {a!r} is neither an override (key=value) nor a script (no file {a!r} here)\n"
                         f"    hint: run [overrides] -- train.py [its arguments]; `run --help` lists the groups")
            continue
        if a.startswith("-") or not ("=" in a or a.startswith("~")):
            continue  # a flag: Hydra reads those
        try:
            parser.parse_overrides([a])
        except OverrideParseException as e:
            key = a.split("=", 1)[0]
            found.append(f"error: {key}: the override {a!r} does not parse: {e.message.splitlines()[0]}\n"
                         f"    hint: quote a value with spaces or special characters (key='a b;c'); lists are [a,b], "
                         f"mappings {{k: v}}")
    folder = _config_dir(argv)
    if folder and Path(folder).is_dir():
        for path in sorted(Path(folder).rglob("*.yaml")):
            try:
                yaml.safe_load(path.read_text())
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
                what = getattr(e, "problem", None) or str(e).splitlines()[0]
                found.append(f"error: {where}: not valid YAML: {what}\n    hint: check the brackets, quotes and "
                             f"indentation there")
    return found

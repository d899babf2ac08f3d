"""`run [overrides] -- train.py [its arguments]` (and torchrun's own flags, refused with what to write instead):
the script and its arguments as the overrides of recipe=script, before Hydra reads the command line."""

from __future__ import annotations

import os

def _hydra_quoted(text: str) -> str:
    """``text`` as a quoted value of Hydra's override grammar that composes back to exactly ``text``:
    backslashes are literal except before a quote or at the end (doubled there), quotes are escaped, and
    ``${`` is escaped for OmegaConf (no interpolation)."""
    text = text.replace("${", "\\${")
    out, backslashes = [], 0
    for ch in text:
        if ch == "\\":
            backslashes += 1
            continue
        out.append("\\" * (2 * backslashes) + "\\'" if ch == "'" else "\\" * backslashes + ch)
        backslashes = 0
    return "'" + "".join(out) + "\\" * (2 * backslashes) + "'"


class ScriptArgsError(ValueError):
    pass


# Hydra's own flags that take a value (the value is not a script)
HYDRA_VALUE_FLAGS = ("--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp", "--cfg", "-c",
                      "--package", "-p", "--info", "-i", "--experimental-rerun", "--shell-completion", "-sc")
HYDRA_INFO = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")  # --info's optional value
# torchrun's options, and what they are here
_TORCHRUN_FLAGS = {
    "nproc-per-node": "topology=1x{v} (or topology.devices_per_node={v})",
    "nproc_per_node": "topology=1x{v} (or topology.devices_per_node={v})",
    "nnodes": "topology.nodes={v}",
    "node-rank": "launcher=manual launcher.manual.host={v}", "node_rank": "launcher=manual launcher.manual.host={v}",
    "master-addr": "init.master_addr={v}", "master_addr": "init.master_addr={v}",
    "master-port": "init.master_port={v}", "master_port": "init.master_port={v}",
    "max-restarts": "launcher.max_restarts={v}", "max_restarts": "launcher.max_restarts={v}",
    "standalone": "nothing: one host with a store on a free port is what `run` does by default",
    "rdzv-backend": "init=tcp or init=env (the runner's rendezvous)", "rdzv_backend": "init=tcp or init=env",
    "rdzv-endpoint": "init.master_addr=HOST init.master_port=PORT", "rdzv_endpoint": "init.master_addr=HOST init.master_port=PORT",
    "no-python": "nothing: the script runs in the interpreter `run` runs in", "module": "`-- -m pkg.module`",
}


def _script_start(argv: list[str]) -> int | None:
    """Where the script begins in ``argv``, torchrun-style, without ``--``: the first argument that is neither a
    flag, a flag's value nor an override (``key=value``, ``~key``, ``+key=...``) and names a Python file
    (``train.py``, or a file that exists)."""
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in HYDRA_VALUE_FLAGS:
            skip = True
            continue
        if a.startswith(("-", "~", "+")) or "=" in a:
            continue
        if a.endswith(".py") or os.path.isfile(a):
            return i
    return None


def _torchrun_flag(argv: list[str]) -> str | None:
    """A torchrun option among `run`'s own arguments, as an error that says what it is here; None: none."""
    for i, a in enumerate(argv):
        if not a.startswith("--"):
            continue
        name, _, value = a[2:].partition("=")
        if name in _TORCHRUN_FLAGS:
            if not value and name not in ("standalone", "no-python", "module") and i + 1 < len(argv):
                value = argv[i + 1]
            return (f"`{a}{' ' + value if value and '=' not in a else ''}` is torchrun's option; here: "
                    f"{_TORCHRUN_FLAGS[name].format(v=value or 'N')}; hint: run [overrides] -- train.py [its arguments]")
    return None


def script_overrides(argv: list[str]) -> list[str]:
    """``run [overrides] -- train.py --lr=0.1`` (or, as torchrun takes it, ``run [overrides] train.py --lr=0.1``;
    ``-- -m pkg.train`` for a module) as plain overrides: ``recipe=script``, ``recipe.path`` (or
    ``recipe.module``) and ``recipe.args`` (as typed, without Hydra's quoting)."""
    if "--" in argv:
        cut = argv.index("--")
        ours, script = argv[:cut], argv[cut + 1:]
    else:
        start = _script_start(argv)
        if start is None:
            if (said := _torchrun_flag(argv)) is not None:
                raise ScriptArgsError(said)
            return argv
        ours, script = argv[:start], argv[start:]
    if (said := _torchrun_flag(ours)) is not None:
        raise ScriptArgsError(said)
    if not script:
        raise ScriptArgsError("nothing follows `--`; hint: run [overrides] -- train.py [its arguments]")
    module = None
    if script[0] == "-m":
        if len(script) < 2:
            raise ScriptArgsError("`-m` names no module; hint: run [overrides] -- -m pkg.train [its arguments]")
        module, script = script[1], script[1:]
    what = f"-m {module}" if module else script[0]
    clashing = [a for a in ours if a.split("=", 1)[0].lstrip("+~") in ("recipe.path", "recipe.args", "recipe.module")
                or (a.startswith("recipe=") and a != "recipe=script")]
    if clashing:
        key = "recipe.module" if module else "recipe.path"
        raise ScriptArgsError(f"{clashing[0]!r} and `-- {what} ...` both say what to run; hint: keep one: "
                              f"`run [overrides] -- {what} ...` means recipe=script {key}={module or script[0]}")
    chosen = f"recipe.module={_hydra_quoted(module)}" if module else f"recipe.path={_hydra_quoted(script[0])}"
    return [*ours, "recipe=script", chosen, "recipe.args=[" + ",".join(_hydra_quoted(a) for a in script[1:]) + "]"]

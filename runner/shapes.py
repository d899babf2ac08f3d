"""``topology=NxM`` for any N and M, not only the shapes shipped as files under conf/topology/.

Hydra finds this source through ``hydra.searchpath: [runner-shapes://]`` in conf/job.yaml, once
:func:`runner.cli.setup` has registered it (Hydra discovers plugins only in a ``hydra_plugins``
namespace package, which editable installs cannot expose to its scanner). It only
answers names of the form ``<nodes>x<devices_per_node>``; a shipped file of the same name wins
because it comes earlier in the search path.
"""

from __future__ import annotations

import re
from typing import Optional

from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from omegaconf import OmegaConf

_SHAPE = re.compile(r"^topology/([1-9][0-9]{0,5})x([1-9][0-9]{0,3})(\.yaml)?$")


class TopologyShapeSource(ConfigSource):
    @staticmethod
    def scheme() -> str:
        return "runner-shapes"

    def _shape(self, config_path: str) -> Optional[tuple[int, int]]:
        m = _SHAPE.match(config_path.strip("/"))
        return (int(m.group(1)), int(m.group(2))) if m else None

    def load_config(self, config_path: str) -> ConfigResult:
        shape = self._shape(config_path)
        if shape is None:
            raise ConfigLoadError(f"runner-shapes: {config_path} is not topology/<nodes>x<devices>")
        nodes, devices = shape
        node = OmegaConf.create({
            "defaults": ["/schema/topology/base@_here_", "_self_"],
            "nodes": nodes,
            "devices_per_node": devices,
        })
        return ConfigResult(config=node, path=f"{self.scheme()}://{self.path}", provider=self.provider,
                            header={"package": None})

    def available(self) -> bool:
        return True

    def is_group(self, config_path: str) -> bool:
        return config_path.strip("/") == "topology"

    def is_config(self, config_path: str) -> bool:
        return self._shape(config_path) is not None

    def list(self, config_path: str, results_filter: Optional[ObjectType]) -> list[str]:
        return []  # infinitely many; `run --help` lists the shipped shapes and says any NxM works

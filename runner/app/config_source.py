"""``topology=NxM`` for any N and M, not only the shapes shipped as files under conf/topology/.

The built-in groups are read by Hydra's ``pkg://`` config source. :func:`runner.app.cli.setup` registers
this subclass for that scheme: for our package ``runner.conf`` it also answers ``topology/<N>x<M>``
with a grid topology, and otherwise behaves exactly as Hydra's own source. Shipped files win, and
a user's own ``topology/NxM.yaml`` in --config-dir is found as usual. (A searchpath entry would
do the same, but Hydra allows those only in the primary config, which user job files replace.)
"""

from __future__ import annotations

import re
from typing import Optional

from hydra._internal.core_plugins.importlib_resources_config_source import ImportlibResourcesConfigSource
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigResult
from omegaconf import OmegaConf

PACKAGE = "runner.conf"
_SHAPE = re.compile(r"^topology/([1-9][0-9]{0,5})x([1-9][0-9]{0,3})(\.yaml)?$")


def parse_shape(config_path: str) -> Optional[tuple[int, int]]:
    """(nodes, devices_per_node) of ``topology/<N>x<M>``, else None."""
    m = _SHAPE.match(config_path.strip("/"))
    return (int(m.group(1)), int(m.group(2))) if m else None


class RunnerConfigSource(ImportlibResourcesConfigSource):
    def _shape(self, config_path: str) -> Optional[tuple[int, int]]:
        if self.path != PACKAGE:
            return None
        shape = parse_shape(config_path)
        if shape is None or super().is_config(config_path):
            return None  # not a shape, or shipped as a file
        return shape

    def load_config(self, config_path: str) -> ConfigResult:
        shape = self._shape(config_path)
        if shape is None:
            return super().load_config(config_path)
        node = OmegaConf.create({"defaults": ["/schema/topology/base@_here_", "_self_"],
                                 "nodes": shape[0], "devices_per_node": shape[1]})
        return ConfigResult(config=node, path=f"{self.scheme()}://{self.path}", provider=self.provider,
                            header={"package": None})

    def is_config(self, config_path: str) -> bool:
        return super().is_config(config_path) or self._shape(config_path) is not None

    def list(self, config_path: str, results_filter: Optional[ObjectType]) -> list[str]:
        return super().list(config_path, results_filter)  # the shipped shapes; any other NxM works too

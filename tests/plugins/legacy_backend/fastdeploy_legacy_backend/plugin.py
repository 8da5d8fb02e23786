from fastdeploy.plugins.api import hookimpl
from fastdeploy_legacy_backend.backend import LegacyNumpyBackend


@hookimpl
def fastdeploy_device_backends() -> dict[str, type]:
    return {"legacy-numpy": LegacyNumpyBackend}

"""A stand-in for nvidia-ml-py's ``pynvml`` (no GPU exists here): replays the NVML answers in the JSON file $FAKE_NVML.

Each device is a mapping from call name (with its extra arguments after ``:``)
to what the real binding returns; an error name such as ``"NOT_SUPPORTED"``
raises ``NVMLError`` with NVML's code, as the binding does, and so does a call
the capture does not hold.
"""

import json
import os
from types import SimpleNamespace

_CODES = {"NOT_SUPPORTED": 3, "DRIVER_NOT_LOADED": 9, "LIBRARY_NOT_FOUND": 12, "FUNCTION_NOT_FOUND": 13,
          "GPU_IS_LOST": 15, "LIB_RM_VERSION_MISMATCH": 18}
_TEXT = {3: "Not Supported", 9: "Driver Not Loaded", 12: "NVML Shared Library Not Found", 13: "Function Not Found",
         15: "GPU is lost", 18: "RM has detected an NVML/RM version mismatch."}
NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND = 3, 9, 12
NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_LIB_RM_VERSION_MISMATCH = 13, 18

with open(os.environ["FAKE_NVML"]) as _fh:
    _CAPTURE = json.load(_fh)


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return _TEXT[self.value]


def _answer(table, key):
    value = table.get(key, "NOT_SUPPORTED")
    if isinstance(value, str) and value in _CODES:
        raise NVMLError(_CODES[value])
    return value


def nvmlInit():
    if _CAPTURE.get("nvmlInit"):
        raise NVMLError(_CODES[_CAPTURE["nvmlInit"]])


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(_CAPTURE["devices"])


def nvmlDeviceGetHandleByIndex(index):
    error = _CAPTURE["devices"][index].get("nvmlDeviceGetHandleByIndex")  # e.g. "GPU_IS_LOST"
    if error:
        raise NVMLError(_CODES[error])
    return index


def nvmlSystemGetDriverVersion():
    return _answer(_CAPTURE, "nvmlSystemGetDriverVersion")


def nvmlSystemGetProcessName(pid):
    return _answer(_CAPTURE, f"nvmlSystemGetProcessName:{pid}")


def __getattr__(name):
    if not name.startswith("nvmlDeviceGet"):
        raise AttributeError(name)

    def call(handle, *args):
        value = _answer(_CAPTURE["devices"][handle], ":".join([name, *map(str, args)]))
        if name == "nvmlDeviceGetComputeRunningProcesses":
            return [SimpleNamespace(**proc) for proc in value]
        if name == "nvmlDeviceGetPciInfo":
            return SimpleNamespace(**value)
        return tuple(value) if isinstance(value, list) else value

    return call

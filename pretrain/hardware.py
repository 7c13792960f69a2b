"""The GPUs and networks `ptm plan` knows (configs/hardware/gpus.yaml), a GPU of one's own (a YAML file), and
the peaks behind the trainer's MFU.

    hw = gpu("h100", interconnect="8xndr")            # hw.peak("bf16"), hw.network.bandwidth, hw.launch_us
    mfu(flops_per_s, torch.cuda.get_device_name(), "bf16")
"""
from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, fields, replace

import yaml

from pretrain.config import PRESETS_DIR, ConfigError

HARDWARE_FILE = os.path.join(PRESETS_DIR, "hardware", "gpus.yaml")
MIG_SLICES = 7  # compute slices of a MIG-capable GPU in the catalog (A100, H100, H200)


class HardwareError(ConfigError):
    """An unknown GPU or interconnect, or a hardware file that does not describe one."""


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of the hardware's peaks. `matmul`: None takes the GPU's architecture's, fitted to one
    published result each (configs/hardware/gpus.yaml `generations`; bench/anchors.yaml, the entries marked
    `calibration`); `memory` and `link` are what STREAM-like kernels and NCCL's ring collectives typically reach
    (assumed, not fitted)."""
    matmul: float | None = None
    memory: float = 0.8
    link: float = 0.8

    def on(self, hw: "Hardware") -> "Efficiency":
        """These efficiencies with `matmul` resolved for `hw`."""
        return self if self.matmul is not None else replace(self, matmul=hw.matmul)


@dataclass(frozen=True)
class Network:
    nics: int
    gbit: float  # per NIC, per direction
    latency_s: float  # one ring step across the network
    spec: str

    @property
    def bandwidth(self) -> float:
        """Bytes/s per direction out of one node."""
        return self.nics * self.gbit * 1e9 / 8


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_tflops: dict
    memory_gib: float
    hbm_gbps: float
    nvlink_gbps: float
    gpus_per_node: int
    network: Network
    pcie_gbps: float
    host_memory_gbps: float
    generation: str
    matmul: float  # its architecture's matmul efficiency (Efficiency.matmul)
    launch_us: float  # the host's time per kernel launch (its generation's default, or measured: --calibrate)

    def peak(self, precision: str) -> float | None:
        """Dense peak FLOP/s in `precision`; None where the GPU has no such tensor cores (bf16 on V100)."""
        tflops = self.peak_tflops.get(precision)
        return None if tflops is None else tflops * 1e12


@functools.lru_cache(maxsize=None)
def _catalog() -> dict:
    with open(HARDWARE_FILE) as f:
        return yaml.safe_load(f)


def network(spec: str, what: str = "--interconnect") -> Network:
    """An --interconnect spec: COUNTxNAME (8xhdr, 4xedr, 2x100gbe) or COUNTxGBIT (8x200); `what` names where it
    was given in errors."""
    nets = _catalog()["networks"]
    count, _, kind = str(spec).lower().partition("x")
    if not kind or not count.isdigit() or int(count) < 1:
        raise HardwareError(f"{what} {spec!r} is not NICSxNAME or NICSxGBIT (e.g. 8xhdr, 4x100)")
    if kind in nets:
        return Network(int(count), nets[kind]["gbit"], nets[kind]["latency_us"] * 1e-6, spec)
    try:
        gbit = float(kind)
    except ValueError:
        raise HardwareError(f"{what} {spec!r}: unknown network {kind!r}; known: {', '.join(nets)}, or a "
                            "rate in Gb/s (8x200)") from None
    if not 0 < gbit < math.inf:
        raise HardwareError(f"{what} {spec!r}: a NIC's rate is a positive number of Gb/s (8x200)")
    return Network(int(count), gbit, nets["hdr"]["latency_us"] * 1e-6, spec)


def _positive(name: str, field: str, value, whole: bool = False) -> None:
    """A GPU entry's number: positive and finite (a count: whole)."""
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) or not 0 < value < math.inf:
        raise HardwareError(f"GPU {name}: {field}: {value!r} is not a positive {'whole ' * whole}number; see "
                            f"{HARDWARE_FILE} for the fields")


def _hardware(name: str, entry: dict, interconnect: str | None) -> Hardware:
    wanted = {f.name for f in fields(Hardware)} - {"name", "matmul", "generation", "launch_us"}
    missing = sorted(wanted - set(entry))
    if missing:
        raise HardwareError(f"GPU {name}: missing {', '.join(missing)}; see {HARDWARE_FILE} for the fields")
    if not isinstance(entry["peak_tflops"], dict) or not entry["peak_tflops"]:
        raise HardwareError(f"GPU {name}: peak_tflops is a mapping of precision to dense TFLOP/s "
                            "({bf16: 989, fp16: 989, fp32: 67})")
    for precision, tflops in entry["peak_tflops"].items():
        _positive(name, f"peak_tflops.{precision}", tflops)
    for key in ("memory_gib", "hbm_gbps", "nvlink_gbps", "pcie_gbps", "host_memory_gbps", "matmul", "launch_us"):
        if key in entry:
            _positive(name, key, entry[key])
    _positive(name, "gpus_per_node", entry["gpus_per_node"], whole=True)
    if entry.get("matmul", 0) > 1:
        raise HardwareError(f"GPU {name}: matmul: {entry['matmul']} is a fraction of the peak, in (0, 1]")
    values = {k: entry[k] for k in wanted}
    values["network"] = network(interconnect) if interconnect is not None else \
        network(entry["network"], f"GPU {name}: network:")
    generations, generation = _catalog()["generations"], entry.get("generation")
    if "matmul" not in entry and generation not in generations:
        raise HardwareError(f"GPU {name}: generation {generation!r} is not one of {', '.join(generations)}; give its "
                            "architecture (generation: ampere), or its own matmul efficiency (matmul: 0.5)")
    values["generation"] = generation or "its own"
    values["matmul"] = entry["matmul"] if "matmul" in entry else generations[generation]["matmul"]
    if "launch_us" not in entry and generation not in generations:
        raise HardwareError(f"GPU {name}: give its generation (generation: hopper) or its host's time per kernel "
                            "launch (launch_us: 60; `ptm plan --calibrate` measures it)")
    values["launch_us"] = entry["launch_us"] if "launch_us" in entry else generations[generation]["launch_us"]
    return Hardware(name=name, **values)


def catalog_names() -> list[str]:
    return list(_catalog()["gpus"])


def efficiency(overrides: list[str]) -> Efficiency:
    """Efficiency with KEY=VALUE overrides (--efficiency matmul=0.5 link=0.7)."""
    changes = {}
    for item in overrides:
        key, _, value = item.partition("=")
        if key not in {f.name for f in fields(Efficiency)}:
            raise ConfigError(f"--efficiency {item}: unknown key {key!r}; use matmul, memory or link")
        try:
            changes[key] = float(value)
        except ValueError:
            raise ConfigError(f"--efficiency {item}: {value!r} is not a number") from None
        if not 0 < changes[key] <= 1:
            raise ConfigError(f"--efficiency {item}: a fraction of the peak is in (0, 1]")
    return replace(Efficiency(), **changes)  # matmul unset: the GPU's architecture's


def gpu(name: str, interconnect: str | None = None, gpus_per_node: int | None = None) -> Hardware:
    """A GPU of the catalog (configs/hardware/gpus.yaml) by its name, or a YAML file of one entry's fields;
    `interconnect` and `gpus_per_node` replace its usual node's."""
    hw = _gpu(name, interconnect)
    return replace(hw, gpus_per_node=gpus_per_node) if gpus_per_node else hw


def _gpu(name: str, interconnect: str | None) -> Hardware:
    if name.endswith((".yaml", ".yml")):
        if not os.path.isfile(name):
            raise HardwareError(f"--gpu {name}: no such file; give a catalog name or a YAML file of one GPU")
        try:
            with open(name) as f:
                entry = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise HardwareError(f"--gpu {name}: not valid YAML ({' '.join(str(e).split())}); fix the file") from None
        if not isinstance(entry, dict):
            raise HardwareError(f"--gpu {name}: not a mapping of a GPU's fields (see {HARDWARE_FILE})")
        return _hardware(os.path.basename(name).rsplit(".", 1)[0], entry, interconnect)
    gpus = _catalog()["gpus"]
    if name not in gpus:
        raise HardwareError(f"--gpu {name}: unknown GPU; known: {', '.join(gpus)}, or a YAML file of your own")
    return _hardware(name, gpus[name], interconnect)


@functools.lru_cache(maxsize=None)
def by_device_name(device_name: str) -> Hardware | None:
    """The catalog's GPU for a `torch.cuda.get_device_name()`; None for a CPU or an unknown device (once per name:
    the trainer's MFU asks every step)."""
    for name, entry in _catalog()["gpus"].items():
        if any(n.lower() in device_name.lower() for n in entry.get("names", ())):
            return _hardware(name, entry, None)
    return None


# ------------------------------------------------------------------------------------ peaks and MFU

def peak_flops(device_name: str, precision: str) -> float | None:
    """Dense peak FLOPs/s of a GPU named like `torch.cuda.get_device_name()` (configs/hardware/gpus.yaml), or of the
    MIG slice of one so named; None if unknown (or a CPU)."""
    hw = by_device_name(device_name)
    peak = None if hw is None else hw.peak(precision)
    return None if peak is None else peak * mig_share(device_name)


def mig_share(device_name: str) -> float:
    """The share of its GPU's compute a MIG slice has: "NVIDIA A100-SXM4-80GB MIG 3g.40gb" is 3 of the 7 compute
    slices of an A100/H100/H200, "... MIG 1c.3g.40gb" (a compute instance in it) 1 of 7; 1 for a whole GPU."""
    m = re.search(r"\bMIG (?:(\d+)c\.)?(\d+)g\.", device_name)
    return 1.0 if m is None else int(m.group(1) or m.group(2)) / MIG_SLICES


def mfu(flops_per_second: float, device_name: str, precision: str) -> float | None:
    """Model FLOPs utilisation of one GPU: its achieved model FLOPs/s over the device's peak."""
    peak = peak_flops(device_name, precision)
    return None if peak is None else flops_per_second / peak

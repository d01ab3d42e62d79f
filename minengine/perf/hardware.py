"""Accelerator spec table: the numbers a roofline and a capacity plan start from.

Every entry quotes the vendor datasheet. Three conventions, applied to every row:

* ``bf16_tflops`` / ``fp8_tflops`` are **dense** tensor-core peaks (datasheets print the 2:4-sparsity
  figure first, twice as large; we halve it). Peaks are rarely reached: expect 60-80 % in practice.
* ``bandwidth_bytes_per_s`` is decimal (3.35 TB/s = 3.35e12 B/s), as datasheets print it.
* ``memory_bytes`` treats the datasheet's "80GB" as GiB (80 * 2**30): HBM and GDDR parts are built from
  binary-sized stacks, and drivers report close to that (an H100 80GB shows ~79.6 GiB in nvidia-smi;
  the rest, and the CUDA context, is what ``gpu_memory_utilization`` and the activation reserve of
  ``minengine.kvcalc`` leave aside).

What fraction of these peaks each kind of kernel reaches (GEMMs, weight and KV streaming, attention) is
in the table next to this one, ``minengine.perf.efficiency``, with its sources.

The table is only what vendors promise; ``minengine.perf.measure.measure_this_machine()`` measures the
machine you are on (read bandwidth and matmul FLOP/s) and returns the same ``Accelerator`` record.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30
GB = 10**9
TB = 10**12


@dataclass(frozen=True)
class Accelerator:
    """One accelerator's datasheet numbers (dense peaks; see the module docstring for units)."""

    name: str
    key: str
    bf16_tflops: float  # dense BF16 tensor-core TFLOP/s
    fp8_tflops: float | None  # dense FP8 TFLOP/s; None where the hardware has no FP8 tensor cores
    memory_bytes: int
    bandwidth_bytes_per_s: float
    source: str
    # The GPU-to-GPU link tensor parallelism's all-reduces cross: bytes/s in each direction (datasheets
    # print NVLink's both directions together: 900 GB/s for an H100 SXM is 450 each way), and its name.
    link_bandwidth_bytes_per_s: float = 0.0
    link: str = ""

    @property
    def ridge_point(self) -> float:
        """FLOP per byte at which BF16 compute and memory bandwidth take equal time.

        A kernel with lower arithmetic intensity is bandwidth-bound (decode at small batch); higher is
        compute-bound (prefill).
        """
        return self.bf16_tflops * 1e12 / self.bandwidth_bytes_per_s

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB


# Keep keys lowercase with dashes; ALIASES below maps the short names people type.
_ACCELERATORS: list[Accelerator] = [
    # NVIDIA A100 Tensor Core GPU datasheet (2021): BF16 312 TFLOPS dense (624 sparse);
    # 40GB HBM2 at 1,555 GB/s, 80GB HBM2e at 2,039 GB/s (SXM). No FP8 on Ampere.
    Accelerator("A100 40GB SXM", "a100-40gb", 312.0, None, 40 * GiB, 1.555 * TB,
                "NVIDIA A100 datasheet: BF16 312 TFLOPS dense, 40GB HBM2, 1,555 GB/s",
                link_bandwidth_bytes_per_s=300 * GB, link="NVLink 3, 600 GB/s both ways (A100 datasheet)"),
    Accelerator("A100 80GB SXM", "a100-80gb", 312.0, None, 80 * GiB, 2.039 * TB,
                "NVIDIA A100 datasheet: BF16 312 TFLOPS dense, 80GB HBM2e, 2,039 GB/s",
                link_bandwidth_bytes_per_s=300 * GB, link="NVLink 3, 600 GB/s both ways (A100 datasheet)"),
    # NVIDIA H100 Tensor Core GPU datasheet: SXM BF16 1,979 / FP8 3,958 TFLOPS *with sparsity*
    # (dense = half), 80GB HBM3 at 3.35 TB/s; PCIe BF16 1,513 / FP8 3,026 sparse, 80GB HBM2e at 2 TB/s.
    Accelerator("H100 SXM 80GB", "h100-sxm", 989.4, 1978.9, 80 * GiB, 3.35 * TB,
                "NVIDIA H100 datasheet (SXM): BF16 989 / FP8 1,979 TFLOPS dense, 80GB HBM3, 3.35 TB/s",
                link_bandwidth_bytes_per_s=450 * GB, link="NVLink 4, 900 GB/s both ways (H100 datasheet)"),
    Accelerator("H100 PCIe 80GB", "h100-pcie", 756.5, 1513.0, 80 * GiB, 2.0 * TB,
                "NVIDIA H100 datasheet (PCIe): BF16 756 / FP8 1,513 TFLOPS dense, 80GB HBM2e, 2.0 TB/s",
                link_bandwidth_bytes_per_s=64 * GB,
                link="PCIe Gen5 x16, 128 GB/s both ways (H100 datasheet; its NVLink bridge pairs 2 cards)"),
    # NVIDIA H200 Tensor Core GPU datasheet: same compute as H100 SXM; 141GB HBM3e at 4.8 TB/s.
    Accelerator("H200 SXM 141GB", "h200", 989.4, 1978.9, 141 * GiB, 4.8 * TB,
                "NVIDIA H200 datasheet (SXM): BF16 989 / FP8 1,979 TFLOPS dense, 141GB HBM3e, 4.8 TB/s",
                link_bandwidth_bytes_per_s=450 * GB, link="NVLink 4, 900 GB/s both ways (H200 datasheet)"),
    # NVIDIA L4 datasheet: BF16 242 / FP8 485 TFLOPS with sparsity; 24GB GDDR6 at 300 GB/s.
    Accelerator("L4 24GB", "l4", 121.0, 242.5, 24 * GiB, 0.300 * TB,
                "NVIDIA L4 datasheet: BF16 121 / FP8 242.5 TFLOPS dense, 24GB GDDR6, 300 GB/s",
                link_bandwidth_bytes_per_s=32 * GB, link="PCIe Gen4 x16, 64 GB/s both ways (L4 datasheet)"),
    # NVIDIA L40S datasheet: BF16 362.05 dense (733 sparse), FP8 733 dense (1,466 sparse); 48GB GDDR6
    # at 864 GB/s.
    Accelerator("L40S 48GB", "l40s", 362.05, 733.0, 48 * GiB, 0.864 * TB,
                "NVIDIA L40S datasheet: BF16 362 / FP8 733 TFLOPS dense, 48GB GDDR6, 864 GB/s",
                link_bandwidth_bytes_per_s=32 * GB,
                link="PCIe Gen4 x16, 64 GB/s both ways (L40S datasheet; no NVLink)"),
    # NVIDIA Ada Lovelace architecture whitepaper, appendix (GeForce RTX 4090): BF16 tensor 165.2 TFLOPS
    # dense with FP32 accumulate (what PyTorch uses), FP8 330.3; 24GB GDDR6X at 1,008 GB/s.
    Accelerator("GeForce RTX 4090 24GB", "rtx-4090", 165.2, 330.3, 24 * GiB, 1.008 * TB,
                "NVIDIA Ada whitepaper: BF16 165 (FP32 acc.) / FP8 330 TFLOPS dense, 24GB GDDR6X, "
                "1,008 GB/s", link_bandwidth_bytes_per_s=32 * GB,
                link="PCIe Gen4 x16, 64 GB/s both ways (no NVLink on the 4090)"),
    # AMD Instinct MI300X datasheet: BF16 1,307.4 / FP8 2,614.9 TFLOPS dense; 192GB HBM3 at 5.3 TB/s.
    Accelerator("AMD Instinct MI300X 192GB", "mi300x", 1307.4, 2614.9, 192 * GiB, 5.3 * TB,
                "AMD MI300X datasheet: BF16 1,307 / FP8 2,615 TFLOPS dense, 192GB HBM3, 5.3 TB/s",
                link_bandwidth_bytes_per_s=448 * GB,
                link="Infinity Fabric, 7 links, 896 GB/s peak in all (MI300X datasheet)"),
]

ACCELERATORS: dict[str, Accelerator] = {acc.key: acc for acc in _ACCELERATORS}

ALIASES: dict[str, str] = {
    "a100": "a100-80gb",
    "a100-40": "a100-40gb",
    "a100-80": "a100-80gb",
    "h100": "h100-sxm",
    "h100-80gb": "h100-sxm",
    "h200-sxm": "h200",
    "h200-141gb": "h200",
    "4090": "rtx-4090",
    "l40-s": "l40s",
}


class UnknownAcceleratorError(KeyError, ValueError):
    """Unknown accelerator key; a KeyError for dict-like use, a ValueError for input validation."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


def _normalise(key: str) -> str:
    return key.strip().lower().replace("_", "-").replace(" ", "-")


def list_accelerators() -> list[str]:
    """Valid keys, in table order."""
    return list(ACCELERATORS)


def get_accelerator(key: str | Accelerator) -> Accelerator:
    """Look up an accelerator by key or alias ("h100", "A100_80GB", ...).

    Raises UnknownAcceleratorError (a KeyError) listing the valid keys, so a typo in a notebook or on the
    command line says what to type.
    """
    if isinstance(key, Accelerator):
        return key
    norm = _normalise(key)
    norm = ALIASES.get(norm, norm)
    if norm not in ACCELERATORS:
        raise UnknownAcceleratorError(f"unknown accelerator {key!r}; valid keys: {', '.join(ACCELERATORS)}")
    return ACCELERATORS[norm]

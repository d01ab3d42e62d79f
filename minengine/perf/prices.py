"""What a GPU-hour costs, and what a million tokens then cost.

``GPU_PRICES`` lists on-demand list prices, each with its provider's offer, where the figure was read
and when. Prices change every few months and differ by region, commitment and provider, so treat the
table as a dated example and put in your own: every function here takes a price in dollars per GPU-hour,
and ``gpu_price`` only picks a row. Providers publish these on pages that change in place; the rows
below were read from copies of those pages (the source names both), so check the live page before
quoting one. AWS's own announcement of its June 2025 cut (up to 45 % on P4 and P5) is consistent with
its rows: p5.48xlarge at $98.32 an hour before, 44 % less after.

A fleet is billed for its GPU-hours, busy or idle, and makes tokens; so

    $ per million tokens = GPUs x $ per GPU-hour / (tokens per second x 3600) x 10^6

with the tokens counted at the load the service can take within its SLO (its goodput), not at the
busiest load it can be pushed to. ``token_costs`` splits that bill between prompt (input) and generated
(output) tokens by the share of GPU time each kind of work took, the way a price list quotes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from minengine.perf.hardware import get_accelerator

AWS_CUT_2025 = ("https://aws.amazon.com/blogs/aws/announcing-up-to-45-price-reduction-for-amazon-ec2-"
                "nvidia-gpu-accelerated-instances/ (2025-06-05: On-Demand P5 -44 %, P5en -25 %, P4d/P4de "
                "-33 % from 2025-06-01)")


@dataclass(frozen=True)
class GpuPrice:
    """One on-demand offer: ``usd_per_hour`` for the whole offer of ``num_gpus`` GPUs."""

    gpu: str  # accelerator key (minengine.perf.hardware)
    provider: str
    offer: str
    num_gpus: int
    usd_per_hour: float
    source: str
    date: str  # when the price was read or in force

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.num_gpus

    def describe(self) -> str:
        return (f"${self.usd_per_gpu_hour:.2f}/GPU-h: {self.provider} {self.offer} on demand "
                f"({self.num_gpus} GPU{'s' if self.num_gpus > 1 else ''}, ${self.usd_per_hour:,.2f}/h; "
                f"{self.date})")


_AWS = "AWS EC2 on-demand price list, us-east-1, as copied by instances.vantage.sh; see " + AWS_CUT_2025
_LAMBDA = "https://lambda.ai/instances (per GPU-hour), read through a copy dated 2026-09-20"
_COREWEAVE = "https://www.coreweave.com/pricing (8-GPU HGX node), read through a copy dated 2026-09-20"

GPU_PRICES: tuple[GpuPrice, ...] = (
    GpuPrice("h100-sxm", "AWS", "p5.48xlarge", 8, 55.04, _AWS, "2026-01"),
    GpuPrice("h100-sxm", "CoreWeave", "HGX H100", 8, 49.24, _COREWEAVE, "2026-09"),
    GpuPrice("h100-sxm", "Lambda", "8x H100 SXM", 8, 8 * 3.99, _LAMBDA, "2026-09"),
    GpuPrice("h200", "AWS", "p5en.48xlarge", 8, 63.296, _AWS, "2026-08"),
    GpuPrice("h200", "CoreWeave", "HGX H200", 8, 50.44, _COREWEAVE, "2026-09"),
    GpuPrice("a100-80gb", "AWS", "p4de.24xlarge", 8, 27.44705, _AWS, "2026-01"),
    GpuPrice("a100-80gb", "Lambda", "8x A100 SXM 80GB", 8, 8 * 2.79, _LAMBDA, "2026-09"),
    GpuPrice("a100-40gb", "AWS", "p4d.24xlarge", 8, 21.957642, _AWS, "2026-01"),
    GpuPrice("a100-40gb", "Lambda", "8x A100 SXM 40GB", 8, 8 * 1.99, _LAMBDA, "2026-09"),
    GpuPrice("l4", "AWS", "g6.xlarge", 1, 0.8048, _AWS, "2026-01"),
)


def gpu_prices(gpu: str) -> list[GpuPrice]:
    """Every row for an accelerator (any key or alias ``get_accelerator`` takes), cheapest first."""
    key = get_accelerator(gpu).key
    return sorted((p for p in GPU_PRICES if p.gpu == key), key=lambda p: p.usd_per_gpu_hour)


def gpu_price(gpu: str, provider: str | None = None) -> GpuPrice:
    """One row: the given provider's, else the table's first for that GPU (a hyperscaler's list price).
    A GPU or provider with no row raises a ValueError that says what there is."""
    key = get_accelerator(gpu).key
    rows = [p for p in GPU_PRICES if p.gpu == key]
    if provider is not None:
        rows = [p for p in rows if p.provider.lower() == provider.lower()]
    if not rows:
        known = sorted({f"{p.gpu} ({p.provider})" for p in GPU_PRICES})
        raise ValueError(f"no price for {key}{f' from {provider}' if provider else ''} in the table; give "
                         f"a price per GPU-hour instead. The table has: {', '.join(known)}")
    return rows[0]


def cost_per_million_tokens(num_gpus: int, usd_per_gpu_hour: float, tokens_per_s: float) -> float:
    """Dollars per million tokens for ``num_gpus`` GPUs making ``tokens_per_s`` between them."""
    if tokens_per_s <= 0:
        return float("inf")
    return num_gpus * usd_per_gpu_hour / (tokens_per_s * 3600) * 1e6


@dataclass(frozen=True)
class TokenCosts:
    """A service's bill per token: per million input (prompt) and output tokens, and per request."""

    usd_per_million_input: float
    usd_per_million_output: float
    usd_per_request: float
    prefill_share: float  # of the GPU time, spent on prompts

    def describe(self) -> str:
        return (f"${self.usd_per_million_input:.3f} per million input tokens, "
                f"${self.usd_per_million_output:.2f} per million output tokens "
                f"(${1000 * self.usd_per_request:.3f} per 1,000 requests; prompts took "
                f"{100 * self.prefill_share:.0f} % of the GPU time)")


def token_costs(num_gpus: int, usd_per_gpu_hour: float, request_rate: float, mean_input_tokens: float,
                mean_output_tokens: float, prefill_share: float) -> TokenCosts:
    """Split the fleet's hourly bill at ``request_rate`` between input and output tokens by the share of
    GPU time each took (``prefill_share``: prompts; idle time split the same way). A provider's input
    tokens are cheaper than its output tokens for this reason: a prompt's tokens go through the weights
    together, in a compute-bound step, while each output token needs a step of its own."""
    if request_rate <= 0:
        raise ValueError(f"request_rate must be > 0, got {request_rate}")
    if not 0.0 <= prefill_share <= 1.0:
        raise ValueError(f"prefill_share must be in [0, 1], got {prefill_share}")
    per_hour = num_gpus * usd_per_gpu_hour
    per_request = per_hour / (request_rate * 3600)
    per_input = per_request * prefill_share / mean_input_tokens * 1e6 if mean_input_tokens else 0.0
    per_output = per_request * (1 - prefill_share) / mean_output_tokens * 1e6 if mean_output_tokens else 0.0
    return TokenCosts(per_input, per_output, per_request, prefill_share)

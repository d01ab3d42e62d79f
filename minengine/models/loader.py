"""Find a model (shipped name, packaged model, local HF folder, .gguf file, or hub id), read its
safetensors, build the module. A GGUF file is first converted once into a cached HF folder
(``models/gguf.py``, kept where ``models/gguf_cache.py`` says); from there on it loads like any other folder.

Every failure raises a ``ModelLoadError`` subclass with a message that says what was tried and how to
fix it: learners meet these errors first, so they must not be a wall of library tracebacks.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file

from minengine.models.config import ModelConfig
from minengine.models.errors import ModelLoadError, ModelNotFoundError, WeightMismatchError
from minengine.models.llama import LlamaForCausalLM
from minengine.models.packaged import PACKAGED_MODELS, ModelPackageMissingError, packaged_model_file
from minengine.perf.model_spec import dtype_names

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_MODEL = "tinystories-4m"
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints saved; we recompute them
_MAX_LISTED = 5

# The dtypes a model can be loaded in; every spelling of each comes from perf.model_spec's one table.
_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_DTYPES = {name: dt for short, dt in _TORCH_DTYPES.items() for name in dtype_names(short)}


def cli_default_model() -> str:
    """The model ``minengine generate`` and ``serve`` use without ``--model``: the real SmolLM2 when its
    package is installed (``make`` installs it), else the shipped tiny model. The library's own default
    (``DEFAULT_MODEL``) stays the tiny model, so tests and lessons never pay for a real one by accident."""
    try:
        packaged_model_file("smollm2-135m")
    except ModelPackageMissingError:
        return DEFAULT_MODEL
    return "smollm2-135m"


def list_shipped_models() -> list[str]:
    """Names of the models in ``minengine/assets/`` (folders holding a config.json)."""
    return sorted(p.parent.name for p in ASSETS_DIR.glob("*/config.json"))


def _hub_offline() -> bool:
    """HF_HUB_OFFLINE read at call time (huggingface_hub only reads it once, at import)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    try:
        from huggingface_hub import constants
    except ImportError:
        return True
    return bool(constants.HF_HUB_OFFLINE)


def _from_hub(repo_id: str) -> Path:
    """Download (or find in the HF cache) the json/safetensors/tokenizer files of ``repo_id``."""
    offline = _hub_offline()
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(repo_id, allow_patterns=HUB_ALLOW_PATTERNS, local_files_only=offline)
    except Exception as e:  # the hub raises many types (HTTP, validation, cache misses, timeouts)
        if offline:
            why = "HF_HUB_OFFLINE is set and it is not in the local Hugging Face cache"
            how = "unset HF_HUB_OFFLINE and go online to download it once"
        else:
            first_line = (str(e).strip().splitlines() or [""])[0]
            why = f"{type(e).__name__}: {first_line}"
            how = "check the id on https://huggingface.co (`hf auth login` for gated models) and your network"
        raise ModelNotFoundError(
            f"model {repo_id!r} is not a local folder, and the Hugging Face hub could not provide it "
            f"({why}).\nFix: {how}; or pass a local folder with config.json + *.safetensors, or a shipped "
            f"model name ({', '.join(list_shipped_models()) or 'none installed'})."
        ) from None
    return Path(path)


def resolve_model_path(name_or_path: str | os.PathLike[str] | None = None) -> Path:
    """Turn ``None`` / a shipped name / a local folder / a hub id ``org/name`` into a local folder."""
    # Imported here, not at the top: `python -m minengine.models.gguf_cache` runs that module as __main__,
    # and the package's __init__ (which imports this module) must not import it a second time first.
    from minengine.models import gguf_cache

    name = str(name_or_path) if name_or_path is not None else DEFAULT_MODEL
    local = Path(name).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelNotFoundError(
                f"folder {local} has no config.json: pass a Hugging Face model folder "
                "(config.json + model.safetensors)"
            )
        return local.resolve()
    if local.is_file() and local.suffix == ".gguf":
        return gguf_cache.gguf_model_folder(local)
    if local.exists():
        raise ModelNotFoundError(
            f"{local} is a file; pass the model's folder (with config.json) or a .gguf file instead"
        )
    shipped = list_shipped_models()
    if name in shipped:
        return ASSETS_DIR / name
    if name in PACKAGED_MODELS:
        return gguf_cache.gguf_model_folder(packaged_model_file(name))
    if _HUB_ID.match(name):  # exactly one '/', not starting with '.', '/' or '~'
        return _from_hub(name)
    if name.startswith((".", "/", "~")) or os.sep in name:
        raise ModelNotFoundError(
            f"no folder at {name!r}: pass an existing Hugging Face model folder (config.json + "
            f"model.safetensors), a shipped model name ({', '.join(shipped) or 'none'}), or a hub id "
            "'org/name'"
        )
    raise ModelNotFoundError(
        f"model {name!r} not found: it is not a shipped model (shipped: {', '.join(shipped) or 'none'}), "
        f"not a packaged model ({', '.join(PACKAGED_MODELS)}), not an existing local folder or .gguf file, "
        "and not a hub id of the form 'org/name'.\n"
        f"Fix: check the spelling, pass a folder with config.json + model.safetensors, or a hub id "
        f"such as 'HuggingFaceTB/SmolLM2-135M'."
    )


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """None/"auto" -> cuda if available, else mps if available, else cpu."""
    if device is None or device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        return torch.device("mps" if mps is not None and mps.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, config: ModelConfig, device: torch.device) -> torch.dtype:
    """None -> bf16 on CUDA (fp16 if the GPU lacks bf16), fp32 elsewhere; "auto" -> the checkpoint's."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype == "auto":
        return _DTYPES.get(config.torch_dtype or "float32", torch.float32)
    key = str(dtype).removeprefix("torch.").lower()
    if key not in _DTYPES:
        raise ValueError(
            f"unknown dtype {dtype!r}; use one of {', '.join(_DTYPES)}, 'auto', or a torch.dtype"
        )
    return _DTYPES[key]


def weight_files(path: Path) -> list[Path]:
    """The safetensors file(s) of a model folder: the shards of an index, or model.safetensors."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        shards = [path / f for f in sorted(set(weight_map.values()))]
        missing = [s.name for s in shards if not s.is_file()]
        if missing:
            raise ModelNotFoundError(f"{index} lists shard(s) that are missing: {', '.join(missing)}")
        return shards
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    others = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
    hint = (
        f" (found {', '.join(others[:_MAX_LISTED])}: only safetensors is supported in a folder; "
        "pass a .gguf file itself)"
        if others
        else ""
    )
    raise ModelNotFoundError(
        f"no weights in {path}: expected model.safetensors or model.safetensors.index.json{hint}"
    )


def _listing(items: list[str]) -> str:
    more = f", ... ({len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else ""
    return ", ".join(items[:_MAX_LISTED]) + more


def check_state_dict(
    model: torch.nn.Module, state_dict: dict[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    """Drop ignorable entries, then require exactly the module's names and shapes (strict loading)."""
    sd = {k: v for k, v in state_dict.items() if not k.endswith(_IGNORED_SUFFIXES)}
    if config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)  # tied: the head *is* the embedding
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    wrong = sorted(
        f"{k}: checkpoint {tuple(sd[k].shape)} vs model {expected[k]}"
        for k in set(sd) & set(expected)
        if tuple(sd[k].shape) != expected[k]
    )
    problems = []
    if missing:
        problems.append(f"missing weights: {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected weights: {_listing(unexpected)}")
    if wrong:
        problems.append(f"shape mismatch: {_listing(wrong)}")
    if problems:
        raise WeightMismatchError(
            f"checkpoint does not match {config.architecture} built from its config.json: "
            + "; ".join(problems)
        )
    return sd


@contextmanager
def _no_random_init() -> Iterator[None]:
    """Skip the modules' random init while building on the meta device. The checkpoint (or the seeded
    draw of ``build_random_model``) replaces every tensor anyway, and on meta tensors torch runs the init
    through its Python reference ops, whose first use imports TorchDynamo: about 1 s of every engine's
    start-up (measured 2026-12-02, 2 cores), paid again by each server and notebook process."""
    names = ("normal_", "uniform_", "kaiming_uniform_", "trunc_normal_", "xavier_uniform_", "zeros_", "ones_")
    saved = {name: getattr(torch.nn.init, name) for name in names}
    for name in names:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def _meta_model(config: ModelConfig) -> LlamaForCausalLM:
    """The model's skeleton on the meta device: shapes only, no memory, no random init."""
    with torch.device("meta"), _no_random_init():
        return LlamaForCausalLM(config)


def load_model(
    name_or_path: str | os.PathLike[str] | None = None,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> LlamaForCausalLM:
    """Load a supported decoder in eval mode; the result carries ``.config`` and ``.model_path``."""
    path = resolve_model_path(name_or_path)
    config = ModelConfig.from_pretrained(path)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, config, dev)
    files = weight_files(path)

    # Build on the meta device (no memory, no random init), then adopt the checkpoint tensors directly.
    model = _meta_model(config)
    state_dict: dict[str, torch.Tensor] = {}
    for file in files:  # convert shard by shard so at most one shard sits in memory twice
        try:
            shard = load_file(file)
        except Exception as e:  # safetensors raises its own error types for corrupt or truncated files
            raise ModelLoadError(f"could not read {file}: {type(e).__name__}: {e}") from None
        state_dict.update({k: v.to(device=dev, dtype=torch_dtype) for k, v in shard.items()})
    state_dict = check_state_dict(model, state_dict, config)
    model.load_state_dict(state_dict, strict=False, assign=True)  # names/shapes checked above
    model.tie_weights()
    model.model.rotary_emb.build_cache(dev)
    model.eval().requires_grad_(False)
    assert not any(t.is_meta for t in model.state_dict().values()), "a tensor was left on the meta device"
    model.model_path = path
    return model


def load_tokenizer(name_or_path: str | os.PathLike[str] | None = None):  # -> PreTrainedTokenizerFast
    """The model folder's tokenizer: the class ``transformers.AutoTokenizer`` would pick."""
    path = resolve_model_path(name_or_path)
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise ModelNotFoundError(
            f"no tokenizer in {path}: expected tokenizer.json (or tokenizer.model / vocab.json)"
        )
    if (path / "tokenizer.json").is_file() and _declared_tokenizer_class(path) in _FAST_TOKENIZER_CLASSES:
        # The class AutoTokenizer would resolve to anyway, without its detour through AutoConfig, which
        # imports half of transformers and torch.distributed: ~2.5 s of every engine's start-up
        # (measured 2026-12-02, 2 cores), paid again by each server and notebook process.
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(path))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


# tokenizer_config.json names that mean "the generic tokenizers-library tokenizer" (transformers 5 calls
# it TokenizersBackend; PreTrainedTokenizerFast is its public name in both 4 and 5).
_FAST_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _declared_tokenizer_class(path: Path) -> str | None:
    try:
        return json.loads((path / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None


def build_random_model(
    config: ModelConfig | dict,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    std: float = 0.02,
) -> LlamaForCausalLM:
    """A model with random weights, built in place on the device (no files, no download): the one
    random-model builder of the lessons, the experiment widget and calibration.

    ``config`` is a ``ModelConfig`` or an HF config dict; ``dtype`` defaults to bf16 on CUDA, fp32
    elsewhere. Matrices are drawn from N(0, ``std``) with a generator seeded by ``seed`` (torch's global
    RNG is left alone); 1-D parameters (RMSNorm weights) are 1. Timing depends only on the shape, so a
    random model of a realistic size measures what the tiny shipped model cannot show.
    """
    config = config if isinstance(config, ModelConfig) else ModelConfig.from_hf(config)
    dev = resolve_device(device)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    model = _meta_model(config).to(dtype)  # meta tensors: changing dtype costs nothing yet
    model = model.to_empty(device=dev)
    gen = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, std, generator=gen)
            else:
                p.fill_(1.0)
    model.tie_weights()
    model.model.rotary_emb.build_cache(dev)
    return model.eval().requires_grad_(False)

"""Models built from the code of Paddle's own libraries (PaddleFormers, PaddleX -- the
engine of PaddleOCR 3.x --, PaddleClas, PaddleSeg), with random weights (nothing is
downloaded), saved the way they are deployed: ``paddle.jit.to_static`` then
``paddle.jit.save`` with a ``-1`` batch dimension (and a ``-1`` sequence length for the
text models).  Used by the ecosystem tier (tests/conformance/ecosystem) and
``bench/ecosystem.py``.

Each model keeps its dygraph layer: the reference is the layer's own eager forward.
BatchNorm running statistics are set by one train-mode pass on random inputs (a
random-weight network keeps its activations O(1) then, as a trained one does).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import paddle
import paddle.nn as nn

#: family -> the pip distribution its models come from
LIBRARIES = {
    "decoder": "paddleformers",
    "ocr_det": "paddlex",
    "ocr_rec": "paddlex",
    "classification": "paddleclas",
    "segmentation": "paddleseg",
}
#: family -> the module whose import tells the library is usable
_MODULES = {
    "paddleformers": "paddleformers",
    "paddlex": "paddlex",
    "paddleclas": "paddleclas",
    "paddleseg": "paddleseg",
}


@dataclass
class Arch:
    name: str
    family: str
    build: Callable[[], nn.Layer]
    #: image models: (channels, height, width) of one sample; text models: None
    image: tuple[int, int, int] | None = None
    #: the tier's (smaller) image size, where it differs: (height, width)
    small: tuple[int, int] | None = None
    #: text models: the vocabulary; fixed_seq > 0 when the model cannot take a -1
    #: sequence length (Gemma-3 builds its sliding-window mask in a Python loop)
    vocab: int = 0
    fixed_seq: int = 0
    note: str = ""

    @property
    def library(self) -> str:
        return LIBRARIES[self.family]

    @property
    def text(self) -> bool:
        return self.image is None


ARCHS: dict[str, Arch] = {}


def _arch(arch: Arch) -> None:
    ARCHS[arch.name] = arch


def missing_library(name: str) -> str:
    """Why ``name`` cannot be built here ("" when it can)."""
    library = ARCHS[name].library
    if importlib.util.find_spec(_MODULES[library]) is None:
        return f"{library} is not installed (pip install 'paddle-ipu[ecosystem]')"
    return ""


# -- text: PaddleFormers decoders ---------------------------------------------------

_TINY = dict(
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    fuse_rms_norm=False,  # the fused kernel has no CPU implementation
)


class _Logits(nn.Layer):
    """input_ids -> logits of a PaddleFormers causal LM (no cache, no dict)."""

    def __init__(self, model: nn.Layer, dict_out: bool = False) -> None:
        super().__init__()
        self.m = model
        self.dict_out = dict_out

    def forward(self, input_ids: Any) -> Any:
        if self.dict_out:  # ERNIE-4.5 asserts on labels unless return_dict=True
            return self.m(input_ids, use_cache=False, return_dict=True).logits
        out = self.m(input_ids, use_cache=False, return_dict=False)
        return out[0] if isinstance(out, (list, tuple)) else out


def _lm(model_module: str, model_cls: str, config_cls: str, dict_out: bool = False, **kw: Any):
    def build() -> nn.Layer:
        # dy2static would convert PretrainedConfig.__getattribute__ and recurse without
        # end: that module stays Python
        import paddleformers.transformers.configuration_utils as cu

        paddle.jit.ignore_module([cu])
        module = importlib.import_module(f"paddleformers.transformers.{model_module}")
        config = getattr(module, config_cls)(**{**_TINY, **kw})
        # the eager attention: the portable path (no flash-attention / sdpa kernels)
        with contextlib.suppress(Exception):
            config._attn_implementation = "eager"
        return _Logits(getattr(module, model_cls)(config), dict_out)

    return build


_arch(Arch("ernie4_5", "decoder", _lm("ernie4_5", "Ernie4_5ForCausalLM", "Ernie4_5Config",
           dict_out=True, use_bias=False, tie_word_embeddings=True), vocab=1000,
           note="paddleformers Ernie4_5ForCausalLM"))  # fmt: skip
_arch(Arch("llama", "decoder", _lm("llama", "LlamaForCausalLM", "LlamaConfig"), vocab=1000,
           note="paddleformers LlamaForCausalLM"))  # fmt: skip
_arch(Arch("phi3", "decoder", _lm("phi3", "Phi3ForCausalLM", "Phi3Config"), vocab=1000,
           note="paddleformers Phi3ForCausalLM"))  # fmt: skip
_arch(Arch("gemma3", "decoder", _lm("gemma3_text", "Gemma3ForCausalLM", "Gemma3TextConfig",
           head_dim=16, query_pre_attn_scalar=16, sliding_window=8), vocab=1000, fixed_seq=16,
           note="paddleformers Gemma3ForCausalLM (sliding_window=8: the local layers mask; its "
                "mask is built by a Python loop over the sequence length, so that length is "
                "fixed at 16)"))  # fmt: skip


# -- OCR: PaddleX (PaddleOCR 3.x) --------------------------------------------------


class _Head(nn.Layer):
    """Tensor in, tensor out for PaddleX's OCR models (their forward takes and
    returns lists of numpy arrays)."""

    def __init__(self, model: nn.Layer) -> None:
        super().__init__()
        self.m = model

    def forward(self, x: Any) -> Any:
        return self.m.head(self.m.model(x))


def _px(kind: str, module: str, cls: str, config_module: str, config_cls: str, released: str):
    """PaddleX's own config table of the released checkpoints (MODEL_CONFIGS): the
    bare defaults of some config classes are not the released architecture."""

    def build() -> nn.Layer:
        from paddlex.modules.base.utils.pdparams2safetensors.model_config import MODEL_CONFIGS

        base = f"paddlex.inference.models.{kind}.modeling"
        model_cls = getattr(importlib.import_module(f"{base}.{module}"), cls)
        config_type = getattr(importlib.import_module(f"{base}.{config_module}"), config_cls)
        kw = {k: v for k, v in MODEL_CONFIGS[released].items() if k != "model_type"}
        return _Head(model_cls(config_type(**kw)))

    return build


_DET, _REC = "text_detection", "text_recognition"
for _name, _kind, _mod, _cls, _cmod, _ccls, _rel, _img, _small in [
    ("ppocrv5_mobile_det", _DET, "pp_ocrv5_mobile_det", "PPOCRV5MobileDet",
     "_config_pp_ocrv5_mobile", "PPOCRV5MobileDetConfig", "PP-OCRv5_mobile_det",
     (3, 320, 320), (160, 160)),
    ("ppocrv5_server_det", _DET, "pp_ocrv5_server_det", "PPOCRV5ServerDet",
     "_config_pp_ocrv5_server", "PPOCRV5ServerDetConfig", "PP-OCRv5_server_det",
     (3, 320, 320), (128, 128)),
    ("ppocrv6_small_det", _DET, "pp_ocrv6_small_det", "PPOCRV6SmallDet",
     "_config_pp_ocrv6_small_det", "PPOCRV6SmallDetConfig", "PP-OCRv6_small_det",
     (3, 320, 320), (160, 160)),
    ("ppocrv5_mobile_rec", _REC, "pp_ocrv5_mobile_rec", "PPOCRV5MobileRec",
     "_config_pp_ocrv5_mobile_rec", "PPOCRV5MobileRecConfig", "PP-OCRv5_mobile_rec",
     (3, 48, 320), (48, 160)),
    ("ppocrv5_server_rec", _REC, "pp_ocrv5_server_rec", "PPOCRV5ServerRec",
     "_config_pp_ocrv5_server_rec", "PPOCRV5ServerRecConfig", "PP-OCRv5_server_rec",
     (3, 48, 320), (48, 160)),
    ("ppocrv6_tiny_rec", _REC, "pp_ocrv6_tiny_rec", "PPOCRV6TinyRec",
     "_config_pp_ocrv6_tiny_rec", "PPOCRV6TinyRecConfig", "PP-OCRv6_tiny_rec",
     (3, 48, 320), (48, 160)),
]:  # fmt: skip
    _arch(Arch(_name, "ocr_det" if _kind == _DET else "ocr_rec",
               _px(_kind, _mod, _cls, _cmod, _ccls, _rel), image=_img, small=_small,
               note=f"paddlex {_cls}(MODEL_CONFIGS[{_rel!r}]) -> head(model(x))"))  # fmt: skip


# -- classification: PaddleClas ------------------------------------------------------


def _clas(cls: str) -> Callable[[], nn.Layer]:
    def build() -> nn.Layer:
        from paddleclas.ppcls.arch import backbone

        return getattr(backbone, cls)(pretrained=False)

    return build


for _name, _cls, _img in [
    ("pplcnet_x0_25", "PPLCNet_x0_25", (3, 224, 224)),
    ("pplcnetv2_small", "PPLCNetV2_small", (3, 224, 224)),
    ("pphgnetv2_b0", "PPHGNetV2_B0", (3, 224, 224)),
    ("mobilevit_xxs", "MobileViT_XXS", (3, 256, 256)),
]:
    _arch(Arch(_name, "classification", _clas(_cls), image=_img, note=f"paddleclas {_cls}"))


# -- segmentation: PaddleSeg ---------------------------------------------------------


class _First(nn.Layer):
    """The first output of a PaddleSeg model (they return a list of logits)."""

    def __init__(self, model: nn.Layer) -> None:
        super().__init__()
        self.m = model

    def forward(self, x: Any) -> Any:
        out = self.m(x)
        return out[0] if isinstance(out, (list, tuple)) else out


def _ppliteseg() -> nn.Layer:
    from paddleseg.models import PPLiteSeg
    from paddleseg.models.backbones import STDC1

    return _First(PPLiteSeg(num_classes=19, backbone=STDC1(), arm_out_chs=[32, 64, 128],
                            seg_head_inter_chs=[32, 64, 64]))  # fmt: skip


def _segformer() -> nn.Layer:
    from paddleseg.models import SegFormer
    from paddleseg.models.backbones import MixVisionTransformer_B0

    return _First(SegFormer(num_classes=19, backbone=MixVisionTransformer_B0(), embedding_dim=256))


def _mobileseg() -> nn.Layer:
    from paddleseg.models import PPMobileSeg
    from paddleseg.models.backbones import MobileSeg_Tiny

    backbone = MobileSeg_Tiny(inj_type="AAM", out_feat_chs=[32, 64, 128])
    return _First(PPMobileSeg(num_classes=150, backbone=backbone, upsample="intepolate"))


def _bisenet() -> nn.Layer:
    from paddleseg.models import BiSeNetV2

    return _First(BiSeNetV2(num_classes=19))


def _humanseg() -> nn.Layer:
    from paddleseg.models import PPHumanSegLite

    return _First(PPHumanSegLite(num_classes=2, align_corners=False))


_arch(Arch("ppliteseg_stdc1", "segmentation", _ppliteseg, image=(3, 256, 512), small=(128, 256),
           note="paddleseg PPLiteSeg(STDC1), the Cityscapes configuration"))  # fmt: skip
_arch(Arch("segformer_b0", "segmentation", _segformer, image=(3, 256, 512), small=(128, 256),
           note="paddleseg SegFormer(MixVisionTransformer_B0, 256)"))  # fmt: skip
_arch(Arch("pp_mobileseg_tiny", "segmentation", _mobileseg, image=(3, 256, 256),
           small=(128, 128), note="paddleseg PPMobileSeg(MobileSeg_Tiny AAM), upsample "
           "'intepolate' (the training configuration's value)"))  # fmt: skip
_arch(Arch("bisenetv2", "segmentation", _bisenet, image=(3, 256, 512), small=(128, 256),
           note="paddleseg BiSeNetV2(19)"))  # fmt: skip
_arch(Arch("pp_humanseg_lite", "segmentation", _humanseg, image=(3, 192, 192),
           note="paddleseg PPHumanSegLite(2), PP-HumanSeg v1 lite"))  # fmt: skip


# -- building and saving -------------------------------------------------------------


@contextlib.contextmanager
def dygraph() -> Iterator[None]:
    """Dygraph mode on the CPU, whatever mode the caller is in."""
    static = not paddle.in_dynamic_mode()
    place = paddle.get_device()
    paddle.disable_static()
    paddle.set_device("cpu")
    try:
        yield
    finally:
        paddle.set_device(place)
        if static:
            paddle.enable_static()


def _calibrate_batch_norm(layer: nn.Layer, shape: list[int], seed: int) -> None:
    """Every BatchNorm's running statistics := the batch statistics of one train-mode
    forward on random inputs (momentum 0 for that pass)."""
    kind = nn.layer.norm._BatchNormBase
    norms = [s for s in layer.sublayers(include_self=True) if isinstance(s, kind)]
    if not norms:
        return
    saved = [n._momentum for n in norms]
    for n in norms:
        n._momentum = 0.0
    layer.train()
    rng = np.random.default_rng(seed)
    with paddle.no_grad():
        layer(paddle.to_tensor(rng.uniform(-1, 1, [4, *shape[1:]]).astype("float32")))
    for n, m in zip(norms, saved):
        n._momentum = m
    layer.eval()


@dataclass
class Built:
    """A saved model and the dygraph layer it was saved from."""

    arch: Arch
    prefix: str  # the jit.save path prefix: prefix.json, prefix.pdiparams
    layer: nn.Layer
    feed_name: str
    input_shape: list[int]  # the declared shape (-1 where any size goes)
    meta: dict[str, Any] = field(default_factory=dict)

    def sample(self, rng: np.random.Generator, batch: int = 1, seq: int = 16) -> np.ndarray:
        """An input: images uniform in [-1, 1]; token ids uniform over the vocabulary
        (``seq`` long, or the model's fixed length)."""
        if self.arch.text:
            length = self.arch.fixed_seq or seq
            return rng.integers(0, self.arch.vocab, (batch, length)).astype("int64")
        shape = [batch, *self.input_shape[1:]]
        return rng.uniform(-1, 1, shape).astype("float32")

    def eager(self, x: np.ndarray) -> np.ndarray:
        """The layer's dygraph forward on ``x``: the reference."""
        with dygraph(), paddle.no_grad():
            out = self.layer(paddle.to_tensor(x))
            out = out[0] if isinstance(out, (list, tuple)) else out
            return np.asarray(out.numpy())

    def round_weights_to_fp16(self) -> None:
        """Round the layer's float32 parameters and buffers (BatchNorm statistics) to
        float16 values, in place: its forward is then Paddle's own answer for fp16
        weights with float32 arithmetic (values clamped to +-1e4, as paddle-ipu's fp16
        conversion does)."""
        with dygraph():
            for t in [*self.layer.parameters(), *self.layer.buffers()]:
                if t.dtype == paddle.float32:
                    a = np.clip(t.numpy(), -1e4, 1e4).astype(np.float16).astype(np.float32)
                    # np.asarray: a 0-d tensor's values come back as a numpy scalar,
                    # which set_value refuses
                    t.set_value(np.asarray(a))


def build(name: str, out_dir: str, *, small: bool = True, seed: int = 0) -> Built:
    """Build ``name`` from its library's code, with random weights, and save it under
    ``out_dir`` (``small``: the tier's input size, else the released model's)."""
    arch = ARCHS[name]
    reason = missing_library(name)
    if reason:
        raise RuntimeError(reason)
    with dygraph():
        paddle.seed(seed)
        np.random.seed(seed)
        layer = arch.build()
        if arch.text:
            seq = arch.fixed_seq or -1
            spec = paddle.static.InputSpec([-1, seq], "int64", "input_ids")
        else:
            c, h, w = arch.image  # type: ignore[misc]
            if small and arch.small is not None:
                h, w = arch.small
            spec = paddle.static.InputSpec([-1, c, h, w], "float32", "x")
            _calibrate_batch_norm(layer, list(spec.shape), seed + 7)
        layer.eval()
        static = paddle.jit.to_static(layer, input_spec=[spec], full_graph=True)
        prefix = os.path.join(out_dir, name, "model")
        paddle.jit.save(static, prefix)
    return Built(arch, prefix, layer, spec.name, list(spec.shape), {"note": arch.note})


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref| (the scale of the whole output)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise AssertionError(f"shape {list(got.shape)} != the reference's {list(ref.shape)}")
    return float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {"paddlepaddle": paddle.__version__, "numpy": np.__version__}
    for dist in sorted(set(LIBRARIES.values())):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out

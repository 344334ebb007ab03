"""``wbfe.score``: one checkpoint's scores, through the engine on the executor asked for; a PEFT LoRA adapter
goes to :mod:`wbfe.adapters`. (Named `scoring` so as not to shadow ``wbfe.score``.)
"""

from __future__ import annotations

from typing import Any, Iterable, Literal, Optional, Union

from wbfe.engine import ModelScore, Progress, layer_spectrum, score_source
from wbfe.errors import InvalidOptionError
from wbfe.executors import ExecutorOptions, executor_for
from wbfe.options import ConvView, ScoreOptions, field_defaults, refuse_keywords
from wbfe.sources import open_source, stream_each
from wbfe.sources.peft_adapter import AdapterSource

__all__ = ["ScoreOptions", "ModelScore", "score", "score_here", "Progress", "layer_spectrum"]


_DEFAULTS = field_defaults(ScoreOptions)  # the keywords' defaults are the options' own
_WHERE = field_defaults(ExecutorOptions)
_INTRA_ADAPTER = "--intra multiplies a checkpoint's consecutive matrices, not an adapter's: drop --intra"


def score(
    ref: Any,
    *,
    metrics: Union[str, Iterable[str], None] = _DEFAULTS["metrics"],
    lam: Union[str, float] = _DEFAULTS["lam"],
    conv: Optional[ConvView] = _DEFAULTS["conv"],
    layers: Optional[str] = _DEFAULTS["layers"],
    device: str = _DEFAULTS["device"],
    head: Optional[str] = _DEFAULTS["head"],
    min_eigs: int = _DEFAULTS["min_eigs"],
    ww_compatible: bool = _DEFAULTS["ww_compatible"],
    seed: int = _DEFAULTS["seed"],
    fix_fingers: Optional[str] = _DEFAULTS["fix_fingers"],
    fit: str = _DEFAULTS["fit"],
    intra: bool = _DEFAULTS["intra"],
    base: Any = None,
    progress: Optional[Progress] = None,
    options: Optional[ScoreOptions] = None,
    executor: Literal["local", "ray"] = _WHERE["executor"],
    ray_address: Optional[str] = _WHERE["address"],
    stream: Optional[bool] = _DEFAULTS["stream"],
) -> ModelScore:
    """Score every weight matrix of a checkpoint.

    While it runs, the process's BLAS, OpenMP and torch thread counts are changed (matrices are
    scored on one thread each, side by side) and restored at the end; numeric work on other
    threads of the process meanwhile runs with those counts.

    Args:
        ref: a path, ``org/name[@rev]``, ``timm:<name>``, ``torchvision:<weights>``, an ``nn.Module``
            or a state dict (see :mod:`wbfe.sources`).
        metrics: metric groups (``"bfe,htsr,htmp"`` or an iterable); empty or None for the default, ``bfe,htsr``.
        lam: ``"opt"`` (λ* per matrix) or a fixed prior precision.
        conv: conv-kernel view, ``flatten`` (out × in·k…), ``slices`` (pooled k positions) or
            ``fft`` (WeightWatcher's ``conv2d_fft`` view of 4-D kernels, :mod:`wbfe.linalg.conv_fft`);
            None: the conventions' choice, ``flatten`` (``slices`` with ``ww_compatible``).
        layers: a regular expression; only tensors whose name it matches (``re.search``) are analysed.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` for the eigen-solves.
        head: tensor (or module) name of the classifier / LM head, overriding the built-in rule.
        min_eigs: the tail fits (HT-SR, HTMP) of matrices with fewer eigenvalues are NaN, with the
            reason; BFE-W is computed for any matrix with at least 2 (WeightWatcher-compatible
            mode skips such matrices altogether, as WeightWatcher does).
        ww_compatible: reproduce WeightWatcher 0.7.7's choices (:mod:`wbfe.options.conventions`: conv
            slicing where ``conv`` is left unset, fitting, ...).
        seed: seed of the random steps (the ``rand`` group's permutations, ``intra``'s masks); recorded in the
            options.
        fix_fingers: WeightWatcher's ``fix_fingers`` for the HT-SR power-law fit: ``xmin_peak`` or
            ``clip_xmax`` (see :mod:`wbfe.metrics.fingers`); None for the plain fit.
        fit: the HT-SR tail model: ``pl``, ``tpl`` or ``e_tpl``.
        intra: also score the products of consecutive weight matrices (WeightWatcher's
            ``intra=True``), one row each, role ``intra``, named ``"<first> X <second>"``.
        base: for a PEFT LoRA adapter folder, its base model (any reference): every adapted module
            is also scored merged, W₀ + ΔW, with its change against W₀ (see :mod:`wbfe.adapters`).
        progress: called after each tensor with (done, total, name).
        options: every setting above as one :class:`~wbfe.options.ScoreOptions`; when given, the
            other setting keywords must keep their defaults.
        executor: ``local``, or ``ray``: one Ray task per shard (see :mod:`wbfe.executors.ray_score`),
            the same result (its provenance adds ``executor``); ``progress`` is then called per shard.
        ray_address: with ``executor="ray"``: ``auto``, ``ray://host:port`` or ``host:port``.
        stream: for remote safetensors (docs/remote.md): True reads each tensor with one range request, False
            downloads first, None streams when the files are larger than the free disk; with ``base``, for
            whichever of the adapter and its base is remote.

    Raises:
        InvalidOptionError: a bad option value, or one no asked group reads (:data:`wbfe.options.READ_BY`, e.g.
            ``lam`` without ``bfe`` or ``htmp``). The errors of :func:`wbfe.sources.open_source`.
        NoUsableMatrixError: every weight matrix was skipped.

    Example:
        >>> import torch, wbfe
        >>> s = wbfe.score({"fc.weight": torch.eye(12) * 2.0}, metrics="bfe")
        >>> round(s.summary["bfe_head"], 6)  # identity spectrum: F* = ½·log(2πe)
        1.418939
    """
    given = dict(metrics=() if metrics is None else metrics, lam=lam, conv=conv, layers=layers,
                 device=device, head=head, min_eigs=min_eigs, ww_compatible=ww_compatible, seed=seed,
                 fix_fingers=fix_fingers, fit=fit, intra=intra, stream=stream)
    if options is None:
        options = ScoreOptions(**given)  # type: ignore[arg-type]
    else:
        refuse_keywords(ScoreOptions, given)
    runner = executor_for(ExecutorOptions(executor, ray_address))
    if base is not None:
        if not runner.runs_here:
            raise InvalidOptionError("--base (a LoRA adapter) is scored locally; drop --executor ray")
        return score_here(ref, options, base=base, progress=progress)
    return runner.score(ref, options, score_here, progress=progress)


def score_here(ref: Any, options: ScoreOptions, *, base: Any = None, progress: Optional[Progress] = None) -> ModelScore:
    """:func:`score` in this process: the engine's path, or, for a PEFT LoRA adapter folder (or
    with ``base``), :func:`wbfe.adapters.score_adapter`. The executors run this where they run; it raises
    as :func:`score` does."""
    if base is not None and options.intra:  # only an adapter takes a base: refused before either is opened
        raise InvalidOptionError(_INTRA_ADAPTER)
    # With --base, --stream streams whichever of the adapter and its base is remote and reads the other.
    stream = options.stream if base is None else stream_each([ref, base], options.stream)[0]
    with open_source(ref, stream=stream) as source:
        if base is not None or isinstance(source, AdapterSource):  # ΔW = s·B·A per module
            if options.intra:
                raise InvalidOptionError(_INTRA_ADAPTER)
            from wbfe.adapters import score_adapter

            return score_adapter(source, options, base=base)
        return score_source(source, options, progress=progress)

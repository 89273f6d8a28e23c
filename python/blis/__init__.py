"""BLIS in-process: generate LLM serving workloads, replay them on a
vLLM-style discrete-event simulator, read and compare traces.

Every time is an integer number of microseconds unless a name says
otherwise (``_ms``, ``_s``); token counts are integers; rates are per second.

Typical use, a workload generated once and replayed many times::

    import blis
    w = blis.generate("examples/chat-512.yaml", num_requests=2000)
    for n in (2, 4, 8):
        r = blis.replay(w, model="meta-llama/Llama-3.1-8B-Instruct", num_instances=n)
        print(n, r.summary["ttft_ms"]["p99"])

Settings of :func:`replay` are ``blis-replay run``'s flags with ``_`` for
``-``, parsed by the command line's own parser (same defaults, same errors);
:func:`run_flags` lists them. Errors raise :class:`BlisError` with the
command line's one-line message. The GIL is released while the Rust side
works, so threads replay in parallel.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import pyarrow as pa
import pyarrow.csv as pacsv

from . import _blis
from ._blis import BlisError, Workload

__version__: str = _blis.__version__

__all__ = [
    "BlisError",
    "Workload",
    "Trace",
    "Result",
    "Comparison",
    "generate",
    "import_trace",
    "read_trace",
    "replay",
    "compare",
    "evaluate",
    "Evaluation",
    "fit",
    "Fit",
    "run_flags",
]

PathLike = Union[str, "os.PathLike[str]"]

# Columns of a trace's CSV that are text (the rest are integers, booleans or
# floats, typed by Arrow's reader): given explicitly so that a column that is
# empty in every row stays a string column.
_TEXT_COLUMNS = (
    "client_id",
    "tenant_id",
    "slo_class",
    "session_id",
    "prefix_group",
    "model",
    "status",
    "error_message",
    "finish_reason",
)


def _table(csv_bytes: bytes) -> pa.Table:
    """A trace-v2 CSV as an Arrow table (one row per request)."""
    header = csv_bytes.split(b"\n", 1)[0].decode()
    names = header.split(",")
    types: Dict[str, pa.DataType] = {c: pa.string() for c in _TEXT_COLUMNS if c in names}
    if "reason_ratio" in names:
        types["reason_ratio"] = pa.float64()
    return pacsv.read_csv(
        io.BytesIO(csv_bytes),
        convert_options=pacsv.ConvertOptions(column_types=types),
    )


class Trace:
    """A trace in memory: a measured run or a prediction.

    ``header`` is the trace-v2 header as a dict; ``requests`` one row per
    request with the trace's CSV columns (times in µs since the run start:
    ``arrival_time_us``, ``send_time_us``, ``first_chunk_time_us``,
    ``last_chunk_time_us``; ``status`` ``ok``, ``timeout``, ``error``...).
    """

    def __init__(self, data: "_blis.TraceData") -> None:
        self._data = data
        self._header: Optional[Dict[str, Any]] = None
        self._requests: Optional[pa.Table] = None

    @property
    def header(self) -> Dict[str, Any]:
        """The trace-v2 header (server, hardware, workload, load generator)."""
        if self._header is None:
            self._header = json.loads(self._data.header_json())
        return self._header

    @property
    def requests(self) -> pa.Table:
        """One row per request, as an Arrow table (``.to_pandas()``, polars'
        ``pl.from_arrow``)."""
        if self._requests is None:
            self._requests = _table(self._data.records_csv())
        return self._requests

    def to_pandas(self) -> Any:
        """``requests`` as a pandas DataFrame."""
        return self.requests.to_pandas()

    def workload(self) -> Workload:
        """Its requests as a workload to replay, as ``blis-replay run
        --trace`` replays them: entry at the recorded send times, each
        cancelled after the client's recorded timeout; what happened to
        them is not an input."""
        return self._data.workload()

    def write(self, prefix: PathLike) -> str:
        """Writes it as a trace-v2 bundle (``PREFIX.yaml``, ``PREFIX.csv``);
        returns the header's path."""
        return self._data.write(os.fspath(prefix))

    @property
    def label(self) -> str:
        """Where it came from: its header's path, or ``replay``."""
        return self._data.label

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Trace({len(self)} requests, {self.label})"


class Result(Trace):
    """What :func:`replay` predicted: the summary ``blis-replay run`` writes
    (``summary``, a dict: ``ttft_ms``, ``e2e_ms``, ``itl_ms``, ``tpot_ms``
    percentiles in ms, ``throughput``, ``requests``, ``kv``, ``cluster``,
    ``slo``, ``fitness``...) and the predicted trace (``requests``)."""

    def __init__(self, summary_json: str, data: "_blis.TraceData") -> None:
        super().__init__(data)
        self.summary: Dict[str, Any] = json.loads(summary_json)

    @property
    def fitness(self) -> Optional[float]:
        """The fitness for ``fitness_weights`` (None without weights)."""
        f = self.summary.get("fitness")
        return None if f is None else f.get("score")

    def __repr__(self) -> str:
        s = self.summary
        return (
            f"Result({s['requests']['total']} requests, TTFT p99 "
            f"{s['ttft_ms']['p99']} ms, E2E p99 {s['e2e_ms']['p99']} ms)"
        )


class Comparison(dict):
    """The report of ``blis-calibrate compare`` as a dict (per-request
    errors, distributions, KS, bootstrap CIs, verdict), with ``markdown``."""

    markdown: str

    def __init__(self, report: Dict[str, Any], markdown: str) -> None:
        super().__init__(report)
        self.markdown = markdown


def run_flags() -> List[Tuple[str, bool, str]]:
    """``blis-replay run``'s flags: (name with ``_``, takes a value, help)."""
    return [(f.replace("-", "_"), v, h) for f, v, h in _blis.run_flags()]


_FLAGS: Optional[Dict[str, bool]] = None


def _flags(settings: Dict[str, Any]) -> List[str]:
    """Keyword settings as ``blis-replay run`` flags."""
    global _FLAGS
    if _FLAGS is None:
        _FLAGS = {f: v for f, v, _ in _blis.run_flags()}
    out: List[str] = []
    for key, value in settings.items():
        if value is None:
            continue
        flag = key.replace("_", "-")
        if flag not in _FLAGS:
            raise BlisError(
                f"{key}: not a setting of blis-replay run (see blis.run_flags())"
            )
        takes_value = _FLAGS[flag]
        if isinstance(value, bool):
            if takes_value:
                out += [f"--{flag}", "true" if value else "false"]
            elif value:
                out.append(f"--{flag}")
            continue
        if not takes_value:
            raise BlisError(f"{key}: a switch: give True or False, got {value!r}")
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, os.PathLike):
            value = os.fspath(value)
        elif isinstance(value, dict):
            value = ",".join(f"{k}:{v}" for k, v in value.items())
        out += [f"--{flag}", str(value)]
    return out


def generate(
    spec: Union[PathLike, Dict[str, Any]],
    *,
    seed: Optional[int] = None,
    num_requests: Optional[int] = None,
    horizon_s: Optional[float] = None,
    aggregate_rate: Optional[float] = None,
    base_dir: Optional[PathLike] = None,
) -> Workload:
    """Generates the workload of a spec (a YAML path, or the spec as a dict)
    once, to replay many times.

    ``seed`` overrides the spec's; ``num_requests`` and ``horizon_s`` cut
    it; ``aggregate_rate`` (requests/s) scales every client's rate so that
    they sum to it. A dict's relative data paths resolve against
    ``base_dir`` (default: the current directory). The same generator as
    ``blis-replay run --workload-spec``: same seed, same requests.
    """
    if isinstance(spec, dict):
        text: Optional[str] = json.dumps(spec)
        path = "<dict>"
        base = os.fspath(base_dir) if base_dir is not None else os.getcwd()
    else:
        text = None
        path = os.fspath(spec)
        base = None
    return _blis.generate(
        path, text, base, seed, num_requests, horizon_s, aggregate_rate
    )


def import_trace(
    source: str, *, seed: Optional[int] = None, num_requests: Optional[int] = None
) -> Trace:
    """A public trace: ``KIND:PATH`` with KIND mooncake, azure,
    inference-perf or vllm-gt (as ``blis-replay run --import``), with the
    outcomes it recorded (a real vLLM run's TTFT and E2E, for
    :func:`compare`); ``num_requests`` keeps the lowest request ids. Replay
    it with ``blis.replay(trace)``."""
    return Trace(_blis.import_trace(source, seed, num_requests))


def read_trace(path: PathLike) -> Trace:
    """Reads a trace-v2 bundle (its header ``H.yaml`` or its prefix)."""
    return Trace(_blis.read_trace(os.fspath(path)))


def _is_trace_header(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b"trace_version:" in head


def replay(
    workload: Union[Workload, Trace, PathLike, Dict[str, Any], None] = None,
    **settings: Any,
) -> Result:
    """Replays a workload on the simulated server and returns the prediction.

    ``workload``: a :class:`Workload` (from :func:`generate` or
    :func:`import_trace`: reused without regenerating), a :class:`Trace`
    (its requests replayed as measured), a path to a workload spec or a
    trace header, or a spec as a dict; or None with ``workload_spec=``,
    ``trace=`` or ``import_=`` among the settings.

    ``settings``: ``blis-replay run``'s flags with ``_`` for ``-`` (e.g.
    ``model``, ``hardware``, ``tp``, ``num_instances``, ``routing``,
    ``routing_scorers``, ``policy_config``, ``latency_model``,
    ``max_num_seqs``, ``slo``, ``fitness_weights``); lists become
    comma-separated values, booleans switches or ``true``/``false``.
    """
    if "import_" in settings:
        settings["import"] = settings.pop("import_")
    if "out" in settings:
        raise BlisError("out: replay keeps its results in memory; write them with .write(prefix)")
    obj: Optional[Workload] = None
    if isinstance(workload, Workload):
        obj = workload
    elif isinstance(workload, Trace):
        obj = workload.workload()
    elif isinstance(workload, dict):
        obj = generate(
            workload,
            **{
                k: settings.pop(k)
                for k in ("seed", "num_requests", "horizon_s", "aggregate_rate")
                if k in settings
            },
        )
    elif workload is not None:
        path = os.fspath(workload)
        key = "trace" if _is_trace_header(path) else "workload_spec"
        settings[key] = path
    summary, data = _blis.replay(obj, _flags(settings))
    return Result(summary, data)


def _trace(x: Union[Trace, PathLike], name: str) -> Trace:
    """``x`` as a :class:`Trace`: itself (a :class:`Result` is one), or the
    trace read from its path; anything else is a ``TypeError`` naming
    ``name``."""
    if isinstance(x, Trace):
        return x
    if isinstance(x, (str, os.PathLike)):
        return read_trace(x)
    raise TypeError(
        f"{name}: a blis.Trace, a blis.Result or a trace's path, not {type(x).__name__}"
    )


def compare(
    real: Union[Trace, PathLike],
    sim: Union[Trace, PathLike],
    *,
    resamples: Optional[int] = None,
    seed: Optional[int] = None,
    warmup: Optional[int] = None,
    rtt_ms: Optional[float] = None,
    real_label: Optional[str] = None,
) -> Comparison:
    """Compares a real trace with a predicted one, per request and per
    distribution (``blis-calibrate compare``'s report, in memory).

    ``real``, ``sim``: :class:`Trace` or :class:`Result` objects, or the
    paths of trace bundles (a header ``H.yaml`` or its prefix).

    ``warmup``: leading requests left out (default: the real header's);
    ``rtt_ms``: round trip added to predicted TTFT and E2E (default: the real
    header's measured RTT); ``resamples``/``seed``: the bootstrap's.
    """
    real, sim = _trace(real, "real"), _trace(sim, "sim")
    report, markdown = _blis.compare(
        real._data, sim._data, resamples, seed, warmup, rtt_ms, real_label
    )
    return Comparison(json.loads(report), markdown)



class Evaluation(dict):
    """What ``blis-replay evaluate`` reports for a policy bundle, as a dict:
    ``fitness`` (the mean over seeds of the weighted fitness),
    ``fitness_weights``, ``seeds`` (each seed's metrics), ``summary`` (a
    short text for a search's reflection step) and ``policy``."""

    @property
    def fitness(self) -> float:
        return self["fitness"]


def _bundle_path(bundle: Union[PathLike, Dict[str, Any]], stack: List[str]) -> str:
    if isinstance(bundle, dict):
        f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
        with f:
            json.dump(bundle, f)
        stack.append(f.name)
        return f.name
    return os.fspath(bundle)


def evaluate(
    bundle: Union[PathLike, Dict[str, Any]],
    workload: Union[Workload, Sequence[Workload], PathLike, Dict[str, Any]],
    *,
    seeds: Iterable[int] = (1,),
    **settings: Any,
) -> Evaluation:
    """Scores a policy bundle (a YAML path or a dict: ``num_instances``,
    ``routing``, ``admission``, ``autoscale``, ``kv``...) as ``blis-replay
    evaluate`` does: one replay per seed, the fitness their mean
    (``fitness_weights``, default ``throughput:0.5,p99_ttft:0.3,mean_e2e:0.2``).

    ``workload``: a spec (path or dict), generated once per seed in
    ``seeds``; or :class:`Workload` objects generated beforehand (one per
    seed, their own seeds) and reused across candidates without
    regenerating them. ``settings``: ``blis-replay run``'s flags.
    """
    temp: List[str] = []
    try:
        settings = dict(settings, policy_config=_bundle_path(bundle, temp))
        objs: List[Workload] = []
        if isinstance(workload, Workload):
            objs = [workload]
        elif isinstance(workload, (list, tuple)):
            objs = list(workload)
        elif isinstance(workload, dict):
            cut = {
                k: settings.pop(k)
                for k in ("num_requests", "horizon_s", "aggregate_rate")
                if k in settings
            }
            objs = [generate(workload, seed=s, **cut) for s in seeds]
        else:
            settings["workload_spec"] = os.fspath(workload)
        flags = _flags(settings)
        if not objs:
            flags += ["--seeds", ",".join(str(int(s)) for s in seeds)]
        return Evaluation(json.loads(_blis.evaluate(objs, flags)))
    finally:
        for t in temp:
            os.unlink(t)


class Fit(dict):
    """What ``blis-calibrate fit`` reports (its ``--json``), as a dict, with
    the coefficients file it wrote: ``coefficients_path`` (pass it to
    :func:`replay` as ``coefficients=``) and ``coefficients_yaml``."""

    coefficients_path: str
    coefficients_yaml: str


def fit(
    traces: Union[Trace, PathLike, Sequence[Union[Trace, PathLike]], None] = None,
    *,
    out: Optional[PathLike] = None,
    **settings: Any,
) -> Fit:
    """Fits latency coefficients to real traces by replaying them, as
    ``blis-calibrate fit`` does.

    ``traces``: trace headers, ``KIND:PATH`` public traces (e.g.
    ``vllm-gt:RUN_DIR``) or :class:`Trace` objects (fitted jointly); or
    ``runs=DIR`` among the settings (a folder of runs, trained-physics).
    ``settings``: ``blis-calibrate fit``'s flags with ``_`` for ``-``
    (``latency_model``, ``holdout_fraction``, ``budget_evals``, ``model``,
    ``hardware``, ...). ``out``: the coefficients file to write (default: a
    new temporary file, kept, named in ``coefficients_path``; removed again
    when the fit fails).
    """
    temp: List[str] = []
    made_out = False
    try:
        if traces is None:
            items: List[Union[Trace, PathLike]] = []
        elif isinstance(traces, (Trace, str, os.PathLike)):
            items = [traces]
        else:
            items = list(traces)
        flags: List[str] = []
        for t in items:
            if isinstance(t, Trace):
                d = tempfile.mkdtemp(prefix="blis-fit-")
                temp.append(d)
                flags += ["--trace", t.write(os.path.join(d, "real"))]
            else:
                flags += ["--trace", os.fspath(t)]
        if out is None:
            f = tempfile.NamedTemporaryFile(prefix="blis-coefficients-", suffix=".yaml", delete=False)
            f.close()
            out = f.name
            made_out = True
        flags += ["--out", os.fspath(out)]
        for key, value in settings.items():
            if value is None:
                continue
            flag = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                if value:
                    flags.append(flag)
                continue
            if isinstance(value, (list, tuple)):
                value = ",".join(str(v) for v in value)
            flags += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
        report, coefficients = _blis.fit(flags)
        result = Fit(json.loads(report))
        result.coefficients_path = os.fspath(out)
        result.coefficients_yaml = coefficients
        made_out = False  # the caller's now, named in coefficients_path
        return result
    finally:
        if made_out:
            # A fit that failed leaves no empty temporary file behind.
            try:
                os.unlink(os.fspath(out))
            except OSError:
                pass
        import shutil

        for d in temp:
            shutil.rmtree(d, ignore_errors=True)

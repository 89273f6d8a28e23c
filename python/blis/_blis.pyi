"""Type stubs of the native module (``blis._blis``). Use the functions of
``blis`` itself; these are what they call."""

from typing import List, Optional, Sequence, Tuple

__version__: str

class BlisError(Exception):
    """Bad input or settings: the message names the file, line, field or
    flag to fix (the command line's one-line error)."""

class Workload:
    """Requests in entry order, generated or read once, replayable many times."""

    def __len__(self) -> int: ...
    def header_json(self) -> str:
        """The trace-v2 header as JSON text."""
    def records_csv(self) -> bytes:
        """The requests as trace-v2 CSV bytes (times in µs)."""
    def __reduce__(self) -> object: ...

class TraceData:
    """A trace in memory: header and records with outcomes."""

    @property
    def label(self) -> str: ...
    def __len__(self) -> int: ...
    def header_json(self) -> str: ...
    def records_csv(self) -> bytes: ...
    def workload(self) -> Workload: ...
    def write(self, prefix: str) -> str: ...

def generate(
    spec: str,
    text: Optional[str] = None,
    base_dir: Optional[str] = None,
    seed: Optional[int] = None,
    num_requests: Optional[int] = None,
    horizon_s: Optional[float] = None,
    aggregate_rate: Optional[float] = None,
) -> Workload: ...
def read_trace(path: str) -> TraceData: ...
def import_trace(
    source: str, seed: Optional[int] = None, num_requests: Optional[int] = None
) -> TraceData: ...
def replay(workload: Optional[Workload], flags: List[str]) -> Tuple[str, TraceData]:
    """(summary JSON text, predicted trace)."""
def evaluate(workloads: Sequence[Workload], flags: List[str]) -> str:
    """The evaluation as JSON text."""
def compare(
    real: TraceData,
    sim: TraceData,
    resamples: Optional[int] = None,
    seed: Optional[int] = None,
    warmup: Optional[int] = None,
    rtt_ms: Optional[float] = None,
    real_label: Optional[str] = None,
) -> Tuple[str, str]:
    """(report JSON text, report Markdown)."""
def fit(flags: List[str]) -> Tuple[str, str]:
    """(the fit's report as JSON text, the coefficients file's text)."""
def run_flags() -> List[Tuple[str, bool, str]]: ...

"""Per-model metric families whose zero series cost nothing until something happens to them.

Every counter and histogram series of a declared Model exists at zero from its declaration (docs/specs/metrics.md,
"Series exist before their first event"): about 200 series per Model. As prometheus_client children they took
about 80 KB per Model, and each scrape formatted every one of them through the generic sample path (5 s and
100 MB of garbage for 1,000 Models on the manager, whose event loop stood still meanwhile). Here a family keeps
only the series that have a value; the zero series of a declared owner are derived from its declaration
(``zeros``) each time the family is read, never stored.

- ``SeriesFamily``: one counter, gauge or histogram family: ``inc``/``set``/``observe``/``remove`` by label
  values, and the declared owners' zero series.
- ``ModelSeries``: the registry collector over several families: ``declare``/``forget`` an owner (a model key),
  ``own`` the series with a value that go with it. ``collect()`` yields one ``RenderedFamily`` per family.
- ``RenderedFamily``: a prometheus_client ``Metric`` whose ``samples`` are built only when asked for (the
  generic path: ``generate_latest``, ``get_sample_value``), and whose ``chunks()`` give the same samples as
  Prometheus text, formatted without building ``Sample`` objects (``flexinfer.observability.exposition``).

Both reads give the same series in the same order: the owners' zero series, then the series with a value.
No ``_created`` series (nothing reads them from the text format). A read takes a snapshot of the owners and of
the series with a value, so writes between two chunks neither break it nor show one series twice. Written and
read from one thread (the engine's event loop, which also serves /metrics). Used by
``flexinfer.observability.metrics``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, Literal, TypeVar

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

D = TypeVar("D")
Labels = tuple[str, ...]
Kind = Literal["counter", "gauge", "histogram"]
go_float: Callable[[float], str] = floatToGoString
"""A value as the text format writes it (prometheus_client's own rule, so both reads agree)."""
CHUNK_CHARS = 65536
"""Text per chunk (about): a scrape of many Models is written piece by piece."""


def escape_label_value(value: str) -> str:
    if "\\" not in value and '"' not in value and "\n" not in value:
        return value
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class SeriesFamily(Generic[D]):
    """One metric family (see the module docstring). ``zeros(owner)``: the label values of the series a declared
    owner has at zero. A counter's ``name`` may end in ``_total`` (its samples always do)."""

    def __init__(self, name: str, documentation: str, kind: Kind, labelnames: Sequence[str], *,
                 buckets: Sequence[float] = (), zeros: Callable[[D], Iterable[Labels]] = lambda _: ()) -> None:
        if not labelnames:
            raise ValueError(f"{name}: a per-model family needs labels")
        self.name = name.removesuffix("_total") if kind == "counter" else name
        self.documentation, self.kind, self.labelnames = documentation, kind, tuple(labelnames)
        self.bounds = (*buckets, float("inf")) if kind == "histogram" else ()
        self._le = [go_float(b) for b in self.bounds]
        self._zeros = zeros
        self._values: dict[Labels, list[float]] = {}
        """Series with a value: ``[value]``, or a histogram's per-bucket counts (``+Inf`` last) and its sum."""
        self._order = sorted(range(len(self.labelnames)), key=lambda i: self.labelnames[i])
        self._keys = [f'{self.labelnames[i]}="' for i in self._order]
        self._before_le = sum(1 for n in self.labelnames if n < "le")
        self._zero_histogram = "".join(self.name + '_bucket{{{0}le="' + le + '"{1}}} 0.0\n' for le in self._le) + (
            self.name + "_count{{{2}}} 0.0\n" + self.name + "_sum{{{2}}} 0.0\n")
        """A zero histogram series' lines, to ``format`` with its labels before ``le``, after it, and all of them."""

    # ---------------------------------------------------------------- writes

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        self._slot(labels)[0] += amount

    def set(self, labels: Labels, value: float) -> None:
        self._slot(labels)[0] = value

    def observe(self, labels: Labels, value: float) -> None:
        slot = self._slot(labels)
        bucket = next((i for i, bound in enumerate(self.bounds) if value <= bound), None)
        if bucket is not None:  # NaN falls in no bucket
            slot[bucket] += 1
        slot[-1] += value

    def remove(self, labels: Labels) -> None:
        self._values.pop(labels, None)

    def value(self, labels: Labels) -> list[float] | None:
        """The stored value (``None``: the series has none, at zero if an owner declares it)."""
        return self._values.get(labels)

    def _slot(self, labels: Labels) -> list[float]:
        slot = self._values.get(labels)
        if slot is None:
            slot = self._values[labels] = [0.0] * (len(self.bounds) + 1 if self.bounds else 1)
        return slot

    # ---------------------------------------------------------------- reads

    def series(self, owners: Sequence[D]) -> Iterator[tuple[Labels, list[float] | None]]:
        """Every series once: each owner's zero series that have no value (``None``), then those with one."""
        values = dict(self._values)
        for owner in owners:
            for labels in self._zeros(owner):
                if labels not in values:
                    yield labels, None
        yield from values.items()

    def samples(self, owners: Sequence[D]) -> list[Sample]:
        found = []
        for labels, value in self.series(owners):
            named = dict(zip(self.labelnames, labels, strict=True))
            if not self.bounds:
                found.append(Sample(self._sample_name(), named, value[0] if value else 0.0))
                continue
            cumulative = 0.0
            for i, le in enumerate(self._le):
                cumulative += value[i] if value else 0.0
                found.append(Sample(f"{self.name}_bucket", {**named, "le": le}, cumulative))
            found.append(Sample(f"{self.name}_count", named, cumulative))
            found.append(Sample(f"{self.name}_sum", named, value[-1] if value else 0.0))
        return found

    def lines(self, owners: Sequence[D]) -> Iterator[str]:
        """The family's text lines, headers first."""
        name = self._sample_name() if self.kind == "counter" else self.name
        doc = self.documentation.replace("\\", r"\\").replace("\n", r"\n")
        yield f"# HELP {name} {doc}\n# TYPE {name} {self.kind}\n"
        for labels, value in self.series(owners):
            pairs = [f'{key}{escape_label_value(labels[i])}"' for key, i in zip(self._keys, self._order, strict=True)]
            if not self.bounds:
                yield f"{name}{{{','.join(pairs)}}} {go_float(value[0]) if value else '0.0'}\n"
                continue
            yield from self._histogram_lines(pairs, value)

    def _histogram_lines(self, pairs: list[str], value: list[float] | None) -> Iterator[str]:
        head, tail = ",".join([*pairs[:self._before_le], ""]), ",".join(["", *pairs[self._before_le:]])
        plain = ",".join(pairs)
        if value is None:
            yield self._zero_histogram.format(head, tail, plain)
            return
        cumulative = 0.0
        for i, le in enumerate(self._le):
            cumulative += value[i]
            yield f'{self.name}_bucket{{{head}le="{le}"{tail}}} {go_float(cumulative)}\n'
        yield (f"{self.name}_count{{{plain}}} {go_float(cumulative)}\n"
               f"{self.name}_sum{{{plain}}} {go_float(value[-1])}\n")

    def _sample_name(self) -> str:
        return f"{self.name}_total" if self.kind == "counter" else self.name


class RenderedFamily(Metric, Generic[D]):
    """A family read once: ``samples`` on demand (the generic path), ``chunks()`` as Prometheus text."""

    def __init__(self, family: SeriesFamily[D], owners: Sequence[D]) -> None:
        super().__init__(family.name, family.documentation, family.kind)
        self._family, self._owners = family, owners

    @property
    def samples(self) -> list[Sample]:
        return self._family.samples(self._owners)

    @samples.setter
    def samples(self, _: list[Sample]) -> None:
        """``Metric.__init__`` sets an empty list; the samples come from the family."""

    def chunks(self) -> Iterator[bytes]:
        lines: list[str] = []
        size = 0
        for line in self._family.lines(self._owners):
            lines.append(line)
            size += len(line)
            if size >= CHUNK_CHARS:
                yield "".join(lines).encode()
                lines, size = [], 0
        if lines:
            yield "".join(lines).encode()


class ModelSeries(Generic[D]):
    """The collector of several ``SeriesFamily`` (see the module docstring); register it on a registry."""

    def __init__(self, families: Sequence[SeriesFamily[D]]) -> None:
        self._families = tuple(families)
        self._declared: dict[str, D] = {}
        self._owned: dict[str, set[tuple[SeriesFamily[D], Labels]]] = defaultdict(set)

    def declare(self, owner: str, declaration: D) -> None:
        """``owner``'s zero series are those its ``declaration`` gives (replacing an earlier declaration)."""
        self._declared[owner] = declaration

    def own(self, owner: str, family: SeriesFamily[D], labels: Labels) -> None:
        """The series ``labels`` of ``family`` goes when ``owner`` is forgotten."""
        self._owned[owner].add((family, labels))

    def forget(self, owner: str) -> None:
        """Remove ``owner``'s declaration and every series it owns."""
        self._declared.pop(owner, None)
        for family, labels in self._owned.pop(owner, set()):
            family.remove(labels)

    def describe(self) -> Iterator[Metric]:
        """The family names, for the registry's duplicate check."""
        for family in self._families:
            yield Metric(family.name, family.documentation, family.kind)

    def collect(self) -> Iterator[RenderedFamily[D]]:
        owners = list(self._declared.values())
        for family in self._families:
            yield RenderedFamily(family, owners)

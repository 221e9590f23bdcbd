"""``ModelKey``: a Model's identity, ``namespace/name``, as one small immutable value.

Every part of FlexInfer that acts on one model after a request named it (the proxy's admission, the
activator, the dispatcher and arbiter, grants, both engines, metrics) carries this key. Only the catalog turns a
client's model name into a key (``flexinfer.core.model_index``); nothing downstream resolves a bare name
again, so a name used in two namespaces can never be confused.

The key *is* its canonical text (a ``str`` subclass): it compares and hashes equal to ``"namespace/name"``, so
dictionaries keyed by that text, JSON bodies, annotations and log lines keep working unchanged, while type
hints say where a resolved key (not a client's name) is required. Kubernetes names cannot contain ``/``, so
the text splits unambiguously. Built by ``NamedResource.key`` (``flexinfer.api.base``, so the other namespaced
resources get the same value) and ``parse``.
"""

from __future__ import annotations


class ModelKey(str):
    """``namespace/name`` of one Model (see the module docstring)."""

    __slots__ = ()

    def __new__(cls, namespace: str, name: str) -> ModelKey:
        if not namespace or not name or "/" in namespace or "/" in name:
            raise ValueError(f"a model key needs a namespace and a name without '/': {namespace!r}, {name!r}")
        return super().__new__(cls, f"{namespace}/{name}")

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]
        """Copy and pickle by the two parts (``str`` would pass the joined text)."""
        return self.namespace, self.name

    @classmethod
    def parse(cls, text: str) -> ModelKey | None:
        """The key written as ``namespace/name``; ``None`` when ``text`` is not of that form."""
        namespace, sep, name = text.partition("/")
        if not sep or not namespace or not name or "/" in name:
            return None
        return cls(namespace, name)

    @property
    def namespace(self) -> str:
        return self.partition("/")[0]

    @property
    def name(self) -> str:
        return self.partition("/")[2]

    def __repr__(self) -> str:
        return f"ModelKey({self.namespace!r}, {self.name!r})"

"""Provider verifiers, one module each, each a `verify(source, request) -> Verdict`.

They are listed, with each provider's headers and dedup rule, in the provider table
(ingress/providers.py), whose `verify` is the one entry point: it picks the source's
verifier and turns a verifier bug into a `verifier_error` verdict. The interface the
verifiers share is in base.py, the parsing and checking rules they share in common.py.

The table imports the verifiers, and ingress.sources imports the table to build each Source
(its headers come from the table): so the verifiers import Source for the type checker only
(`if TYPE_CHECKING`), with `from __future__ import annotations`.
"""

from ingress.verifiers.base import StoredRequest, Verdict

__all__ = ["StoredRequest", "Verdict"]

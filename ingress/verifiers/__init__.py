"""Provider verifiers, one module each, each a `verify(source, request) -> Verdict`.

They are listed, with each provider's headers and dedup rule, in the provider table
(ingress/providers.py), whose `verify` is the one entry point: it picks the source's
verifier and turns a verifier bug into a `verifier_error` verdict. The interface the
verifiers share (Source, StoredRequest, Verdict) is in base.py, the parsing and checking
rules they share in common.py.

The imports run one way: ingress.sources (which builds each Source) imports the table, the
table imports the verifiers, and the verifiers import only base.py and common.py (the
`ingress-sources-one-way` contract in pyproject.toml keeps it so).
"""

from ingress.verifiers.base import Source, StoredRequest, Verdict

__all__ = ["Source", "StoredRequest", "Verdict"]

"""Provider verifiers, one module each, each a `verify(source, request) -> Verdict`.

They are listed, with each provider's headers and dedup rule, in the provider table
(ingress/providers.py), whose `verify` is the one entry point: it picks the source's
verifier and turns a verifier bug into a `verifier_error` verdict. The interface the
verifiers share is in base.py, the parsing and checking rules they share in common.py.
"""

from ingress.verifiers.base import StoredRequest, Verdict

__all__ = ["StoredRequest", "Verdict"]



def verify(source, request):  # type: ignore[no-untyped-def]
    # Until the inbox and the receive path import ingress.providers.verify (next commit).
    from ingress.providers import verify as provider_verify

    return provider_verify(source, request)


__all__ += ["verify"]

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ingress.encryption import RawEventKeyError, keyring
from ingress.services import raw_events_rotate_keys


class Command(BaseCommand):
    help = (
        "Rewrite every raw event body that is not stored as the first entry of "
        "RAW_EVENT_ENCRYPTION_KEYS says: under the first key after a rotation (or after "
        "turning encryption on), or as plaintext when the first entry is `plaintext`. "
        "Bounded batches, one short transaction each; safe to stop and run again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=500)
        parser.add_argument(
            "--max-batches", type=int, default=None, help="Stop after this many batches."
        )

    def handle(self, *args: Any, batch_size: int, max_batches: int | None, **options: Any) -> None:
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        try:
            target = keyring().primary_id or "plaintext"
        except RawEventKeyError as exc:
            raise CommandError(str(exc)) from None
        result = raw_events_rotate_keys(batch_size=batch_size, max_batches=max_batches)
        self.stdout.write(
            f"rewrote {result.rewritten} bodies as {target} in {result.batches} batches; "
            f"{result.undecryptable} could not be decrypted with the configured keys"
        )
        if result.undecryptable:
            raise CommandError(
                f"{result.undecryptable} bodies are encrypted with a key that is not in "
                "RAW_EVENT_ENCRYPTION_KEYS (or damaged): they were left as they are."
            )

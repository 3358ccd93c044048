"""How an image's placeholder tokens enter block keys (DESIGN §4, Images).

A vision-language model's prompt holds, for each image, a run of one placeholder token id
(Gemma's ``<image_soft_token>``, LLaVA's ``<image>``...) whose embeddings the engine
replaces by the image's rows. Keyed as they are, two different images at the same place
would share KV. So the prompt the cache sees (the *key tokens*) has each image's run
replaced by ids of its own: ``image_token_ids(digest, n)``, consecutive ids above every
vocabulary, starting at a point drawn from the image's SHA-256.

Everything else follows without a line of cache code knowing about images:

- a block's key covers exactly the images whose tokens fall inside it, in order (their ids
  are in its token bytes), and every later block through the chain;
- a turn that adds an image later keeps every block before it: those tokens are unchanged;
- token-granular follow-ups compare ids, so a stored block of another image never matches;
- the engine finds an image's rows from the ids alone (``ImageRows``), whatever the batch,
  the chunking or the position a restore stopped at.

*Tenants.* A tenant's images draw their start from the digest salted with the tenant's
name (the default tenant's are unsalted), so the ids name whose image it is too: the
engine then finds that tenant's rows, never another's (``domain/cache/image_rows``). Its
blocks are keyed from its own root already, so no block two tenants shared is lost; an
archive exported by one tenant and imported by another restores their text, not their
images.

The limit, said plainly: the start point has 30 bits, so two *different* images at the same
position after the same prefix, in the same model and tenant, get the same ids with
probability 2^-30 (a block's key then names both). Two such images sent to one server
in the same while are told apart at registration (``ImageRows.register`` refuses the
second), so the engine never writes one image's rows for the other.
"""

from __future__ import annotations

import hashlib

IMAGE_ID_BASE = 1 << 30  # above every vocabulary; below 2^31, so ids stay int32 in block files
IMAGE_ID_SPAN = 1 << 30
MAX_IMAGE_TOKENS = 1 << 16  # placeholder tokens one image may take (tiled 4K images: ~10k)


def image_start(digest: str, tenant: str | None = None) -> int:
    """The first key id of the image whose SHA-256 (hex) is ``digest``, in ``tenant``'s
    prompts (None or "": the default tenant's)."""
    if tenant:
        salted = hashlib.sha256(bytes.fromhex(digest) + b"\0tenant\0" + tenant.encode("utf-8"))
        digest = salted.hexdigest()
    return IMAGE_ID_BASE + int(digest[:16], 16) % (IMAGE_ID_SPAN - MAX_IMAGE_TOKENS)


def image_token_ids(digest: str, count: int, tenant: str | None = None) -> range:
    """The key ids of an image's ``count`` placeholder tokens, in order."""
    if not 0 < count <= MAX_IMAGE_TOKENS:
        raise ValueError(f"an image takes 1 to {MAX_IMAGE_TOKENS} tokens, not {count}")
    start = image_start(digest, tenant)
    return range(start, start + count)


def is_image_id(token: int) -> bool:
    return token >= IMAGE_ID_BASE


def text_token_count(tokens: list[int] | tuple[int, ...]) -> int:
    """How many of ``tokens`` are text (not an image's key ids)."""
    return sum(1 for t in tokens if t < IMAGE_ID_BASE)

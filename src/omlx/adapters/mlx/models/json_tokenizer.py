"""A model's tokenizer read from its ``tokenizer.json``, without ``transformers``.

What mlx-lm's ``TokenizerWrapper``, its streaming detokenizers, omlx's prompt encoder,
grammar compiler and chat renderer ask of a Hugging Face fast tokenizer, answered from the
``tokenizers`` package and the folder's ``tokenizer_config.json`` (special tokens, chat
template, whether to clean up spaces when decoding), ``special_tokens_map.json`` and
``chat_template.jinja`` / ``chat_template.json``. ``transformers`` builds its fast
tokenizers from the same ``tokenizer.json``; for the tokenizer classes it post-processes
(``tokenizer_loader.PLAIN_CLASSES`` says which it does not) omlx uses transformers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from omlx.adapters.mlx.models import chat_template

SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def _token_text(value: Any) -> str | None:
    """A special token as configs write it: a string or ``{"content": ...}``."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def folder_chat_template(folder: Path, config: Mapping[str, Any]) -> Any:
    """The folder's chat template: ``chat_template.jinja``, ``chat_template.json``, or the
    config's; a list of named templates becomes a dict by name."""
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    template = read_json(folder / "chat_template.json").get("chat_template")
    if template is None:
        template = config.get("chat_template")
    if isinstance(template, list):
        return {t["name"]: t["template"] for t in template if isinstance(t, Mapping)}
    return template


def _clean_up_spaces(text: str) -> str:
    """The space clean-up transformers applies when a config asks for it."""
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text


class JsonTokenizer:
    """A fast tokenizer over ``tokenizers.Tokenizer`` with the Hugging Face methods omlx uses."""

    def __init__(
        self,
        backend: Tokenizer,
        config: Mapping[str, Any],
        special_tokens: Mapping[str, Any] | None = None,
        template: Any = None,
        name: str = "",
    ) -> None:
        self.backend_tokenizer = backend
        self.init_kwargs = dict(config)
        self.name_or_path = name
        self.chat_template = template
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        merged = {**(special_tokens or {}), **config}
        self._special = {
            name: text
            for name in SPECIAL_TOKEN_NAMES
            if (text := _token_text(merged.get(name))) is not None
        }
        extra = merged.get("additional_special_tokens") or merged.get("extra_special_tokens") or []
        self._additional = [t for t in map(_token_text, extra) if t is not None]
        self._vocab: dict[str, int] | None = None

    @classmethod
    def from_folder(cls, folder: Path) -> JsonTokenizer:
        config = read_json(folder / "tokenizer_config.json")
        return cls(
            Tokenizer.from_file(str(folder / "tokenizer.json")),
            config,
            read_json(folder / "special_tokens_map.json"),
            folder_chat_template(folder, config),
            name=str(folder),
        )

    # ---- vocabulary ---------------------------------------------------------------

    def get_vocab(self) -> dict[str, int]:
        if self._vocab is None:  # 50-150k entries: read once
            self._vocab = self.backend_tokenizer.get_vocab(with_added_tokens=True)
        return dict(self._vocab)

    @property
    def vocab(self) -> dict[str, int]:
        return self.get_vocab()

    @property
    def vocab_size(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> Any:
        to_token = self.backend_tokenizer.id_to_token
        if isinstance(ids, int):
            return to_token(ids)
        return [to_token(i) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> Any:
        def one(token: str) -> int | None:
            found = self.backend_tokenizer.token_to_id(token)
            return found if found is not None else self.unk_token_id

        if isinstance(tokens, str):
            return one(tokens)
        return [one(t) for t in tokens]

    def get_added_tokens_decoder(self) -> dict[int, Any]:
        return self.backend_tokenizer.get_added_tokens_decoder()

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return self.get_added_tokens_decoder()

    # ---- special tokens -----------------------------------------------------------

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens (what templates see as ``bos_token`` and the like)."""
        return dict(self._special)

    def _special_id(self, name: str) -> int | None:
        text = self._special.get(name)
        return None if text is None else self.backend_tokenizer.token_to_id(text)

    @property
    def bos_token(self) -> str | None:
        return self._special.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self._special.get("eos_token")

    @property
    def unk_token(self) -> str | None:
        return self._special.get("unk_token")

    @property
    def pad_token(self) -> str | None:
        return self._special.get("pad_token")

    @property
    def bos_token_id(self) -> int | None:
        return self._special_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._special_id("eos_token")

    @property
    def unk_token_id(self) -> int | None:
        return self._special_id("unk_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._special_id("pad_token")

    @property
    def all_special_tokens(self) -> list[str]:
        seen = [*self._special.values(), *self._additional]
        return list(dict.fromkeys(seen))

    @property
    def all_special_ids(self) -> list[int]:
        ids = (self.backend_tokenizer.token_to_id(t) for t in self.all_special_tokens)
        return [i for i in ids if i is not None]

    # ---- text ---------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True, **_: Any) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str, add_special_tokens: bool = True, **_: Any) -> dict[str, Any]:
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def decode(
        self,
        ids: int | Sequence[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **_: Any,
    ) -> str:
        ids = [ids] if isinstance(ids, int) else list(ids)
        text = self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        clean = (
            self.clean_up_tokenization_spaces
            if clean_up_tokenization_spaces is None
            else clean_up_tokenization_spaces
        )
        return _clean_up_spaces(text) if clean else text

    def batch_decode(self, sequences: Iterable[Sequence[int]], **kwargs: Any) -> list[str]:
        return [self.decode(s, **kwargs) for s in sequences]

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None = None,
        documents: Sequence[Any] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        tokenize: bool = True,
        return_dict: bool = False,
        **kwargs: Any,
    ) -> Any:
        template = self.chat_template
        if chat_template is not None:
            named = isinstance(template, Mapping) and chat_template in template
            template = template[chat_template] if named else chat_template
        if template is None:
            raise ValueError(
                "this tokenizer has no chat template (tokenizer_config.json, chat_template.jinja)"
            )
        text = chat_template_render(
            template,
            conversation,
            special_tokens=self.special_tokens_map,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **kwargs,
        )
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        return {"input_ids": ids} if return_dict else ids


chat_template_render = chat_template.render

"""The Anthropic API family: messages and token counts."""

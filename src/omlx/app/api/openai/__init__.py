"""The OpenAI API family: chat completions and completions."""

"""The OpenAI Responses API family: create, stream, get and delete stored responses."""

"""The chat use case: render, constrain, run and split a turn, for every API family."""

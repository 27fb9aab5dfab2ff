"""Starting a run: the plan (ranks and launch units), the files rendered from it, the shell commands
that start, follow and stop units on a node, and the monitor that watches them."""

"""One launch of a run: the plan (ranks and launch units), the files rendered from it, the shell
commands that start, follow and stop units on a node, which runs are live on the machines (and
`fab stop` of one), the monitor that watches them (and the heartbeat that notices a silent node),
and the views of a launch's units (`fab status`, `fab logs`)."""

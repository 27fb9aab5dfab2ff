"""The kubernetes cluster kind: the objects a run creates and the flow that drives them."""

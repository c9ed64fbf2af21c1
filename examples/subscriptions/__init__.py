"""A worked example of a team's own agent in the desk (docs/agent-authors.md):
a subscriptions service of the team's (service.py), its client (client.py),
and the agent over it, written with the ``tool`` decorator (agent.py) and, for
comparison, with plain ``ToolSpec``s (agent_plain.py); scenario.json plays the model."""

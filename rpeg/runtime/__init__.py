"""The runtime: the torch side of RPEG that trains what the planner planned.

`algos` holds the algorithm math (advantage estimators, KL estimators, losses) as pure
functions in registries. Nothing is imported here, so `import rpeg.runtime` stays cheap.
"""

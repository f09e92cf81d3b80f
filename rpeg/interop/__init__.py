"""Reading the peers' job configs into RPEG and writing RPEG's plans as the peers' configs.

`common` holds the neutral view both directions share; one module per system (verl, openrlhf,
areal) reads and writes that system's config. Nothing here imports torch or ray.
"""

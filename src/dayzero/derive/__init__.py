"""Day 0 for any model: the model description derived from its own modeling code.

``describe`` builds the model on the meta device and reads its structure (:mod:`.structure`,
:mod:`.describe`); ``spec_from_description`` maps it into the planner's ModelSpec, stating what the
planner can only approximate (:mod:`.to_spec`). Nothing here imports torch at import time.
"""

"""The third transfer set (issue 39): rules fixed before it was recorded, scored on it alone and pooled with the two
transfer sets (``python -m studies.decision_validity --third-set``).

The set (:data:`studies.decision_validity.THIRD`: byte-level GPT-2 decoders of hidden 48 and 3 layers on the Linux
documentation with their own window seeds, residual MLPs of width 96 on sklearn digits drawn with data seed 7) is
recorded to ``studies/results/decision_validity_third/``, a folder that no fit and no earlier rule choice reads. The
rules scored on it and their constants were fixed from the recorded sets before any of it was recorded
(studies/decision-validity.md, "A third transfer set, recorded after the rules were fixed"), and are pinned here:

* the shipped decision (the shipped calibration, ``DEFAULT_CALIBRATION``);
* :data:`studies.decision_short_stops.SGD_RULE`, its training gate fitted on every bench set:
  :data:`SGD_RULE_TRAINING_SE` standard errors;
* the carry-factor rule, its carry fitted on every bench set: :data:`CARRY_FACTOR`.

Nothing here is fitted on the third set.
"""

from __future__ import annotations

SGD_RULE_TRAINING_SE = 1.0  # SGD_RULE's x as fitted on every bench set (results/decision_validity_short_stops.json)
CARRY_FACTOR = 2.9911422150145235  # the carry-factor rule's constant as fitted on every bench set (the same file)
CARRY_RULE = ("stop tolerance against d(T) times the carry to the recipe's length (the median realized change over "
              "d(T))")
THIRD_FOLDER = "decision_validity_third"  # studies/decision_validity.py OUT_THIRD, beside the bench's folder
# the shipping criterion, decided in advance: SGD_RULE ships where, on the third set at 300 and at 1000 steps each, it
# stops in at most this share of the decisions whose realized best gain exceeds 3 seed standard deviations (at least
# one such decision at each length: a length with none does not test the line, and the criterion is not met), inserts
# no more clear harms than the shipped decision, and keeps harms flagged, signs right and best picked no worse
SHORT_STOP_LINE = 0.10

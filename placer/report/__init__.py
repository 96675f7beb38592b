"""Report: the plan file, the human tables, the plain-language why, and the pictures.

``make_plan`` runs a recommendation end to end and returns a ``Recommendation`` (the ``Plan`` plus
the common default it was compared with); ``plan_json`` writes it, ``render_text`` prints it and
``plots.plot_plan`` draws it (matplotlib, optional).
"""

from placer.report.plan import Recommendation, build_plan, make_plan, plan_json
from placer.report.tables import render_text

__all__ = ["Recommendation", "build_plan", "make_plan", "plan_json", "render_text"]

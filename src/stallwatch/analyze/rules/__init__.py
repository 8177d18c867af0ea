"""The profiler rules: pure computations over the frames the store hands them, incremental, with the
parameters, texts and result schema of RULES.md."""

from stallwatch.analyze.rules.base import Chunk, NodeFrame, Rule, RuleResult
from stallwatch.analyze.rules.registry import builtin_rules, get_rule, register_rule

__all__ = ["Chunk", "NodeFrame", "Rule", "RuleResult", "builtin_rules", "get_rule", "register_rule"]

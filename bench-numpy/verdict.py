"""Verdicts from per-round ratios on a noisy machine. A round runs every setup once, close
together in time, so the machine's drift falls on all of them alike and cancels in a ratio of
two runs of one round. The median of the rounds' ratios comes with a distribution-free 95%
interval (the sign test's order statistics): a claim "at most BAR" is made only when the whole
interval is at or under BAR, "over BAR" only when it is wholly above; otherwise the noise
forbids a verdict and we say so."""
import math
import statistics


def median_interval(values, z=1.96):
    """(low, median, high): the median and a ~95% interval for it, from order statistics. With
    fewer than 6 values the interval is the whole range."""
    v = sorted(values)
    n = len(v)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    k = int((n - z * math.sqrt(n)) / 2)  # 0-based rank of the lower bound
    k = max(0, min(k, (n - 1) // 2))
    return (v[k], statistics.median(v), v[n - 1 - k])


def verdict(ratios, bar):
    """'at most BAR', 'over BAR' or 'no verdict' for a lower-is-better ratio."""
    low, _, high = median_interval(ratios)
    if high <= bar:
        return f"<= {bar:g}"
    if low > bar:
        return f"> {bar:g}"
    return "no verdict"


def describe(ratios, bar):
    """'1.02 [0.97-1.06] no verdict': the median ratio, its interval and the verdict."""
    low, med, high = median_interval(ratios)
    return f"{med:.3f} [{low:.3f}-{high:.3f}] {verdict(ratios, bar)}"


def load_average():
    """The 1, 5 and 15 minute load averages, as /proc/loadavg gives them."""
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])

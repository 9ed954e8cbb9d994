"""compare says when its costs rest on prices of different kinds (a rental rate beside a purchase
amortized), which are not like for like."""

from dayzero.report.compare import mixed_prices


def test_mixed_price_kinds_are_named_and_one_kind_is_silent():
    rows = [{"fits": True, "price_kind": "rental", "cluster": "h100-8"},
            {"fits": True, "price_kind": "purchase", "cluster": "910b-8"},
            {"fits": False, "price_kind": "given", "cluster": "x"}, {"fits": True, "price_kind": None, "cluster": "y"}]
    note = mixed_prices(rows)
    assert "purchase: 910b-8" in note and "rental: h100-8" in note and "--price-per-device-hour" in note
    assert "x" not in note.split("(")[1].split(")")[0].split(": ")[-1]  # a card that does not fit is not compared
    assert mixed_prices(rows[:1]) is None and mixed_prices([rows[0], rows[3]]) is None

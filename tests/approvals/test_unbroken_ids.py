"""Order and ticket ids in what the world says stay on one line on a narrow screen
("A-1001", never "A-" / "1001"), and what is around them stays escaped."""

from __future__ import annotations

from approvals.templatetags.approvals_format import unbroken_ids


def test_a_hyphenated_id_is_kept_whole_and_the_rest_is_plain_text():
    assert str(unbroken_ids("Amount of order A-1001")) == 'Amount of order <span class="id">A-1001</span>'
    assert str(unbroken_ids("ticket T-1 is open; ord-7a too")) == (
        'ticket <span class="id">T-1</span> is open; <span class="id">ord-7a</span> too'
    )
    assert str(unbroken_ids("well-known, x-ray, ₹2,900.00")) == "well-known, x-ray, ₹2,900.00"


def test_what_the_world_says_stays_escaped_around_an_id():
    shown = str(unbroken_ids('<img src=x onerror="alert(1)"> A-1001 & <b>B-2</b>'))
    assert "<img" not in shown and "<b>" not in shown
    assert shown == (
        '&lt;img src=x onerror=&quot;alert(1)&quot;&gt; <span class="id">A-1001</span> &amp; '
        '&lt;b&gt;<span class="id">B-2</span>&lt;/b&gt;'
    )

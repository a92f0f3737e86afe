"""RedditAdvice filters (dynamic and static criteria, drop counts, date split, JSONL), the advice prompt,
and the TuringAdvice protocol: majority vote, score, diagnostics, bootstrap interval, the exact McNemar
test, the simulated judge and the two baselines."""

import calendar
import json

import numpy as np
import pytest

from rlhfjax.data import formats
from rlhfjax.errors import ConfigError, DataError
from rlhfjax.evaluation import turing_advice as ta
from rlhfjax.evaluation import winrate
from rlhfjax.sources import reddit_advice as ra


def words(n: int, word: str = "word") -> str:
  return " ".join([word] * n)


def split_count(text: str) -> int:
  return len(text.split())


TITLE = "My boyfriend forgot my birthday"  # 5 words.


def post(pid, **kw):
  row = {"id": pid, "subreddit": "relationships", "author": "op", "title": TITLE,
         "selftext": words(123), "score": 20, "created_utc": 1_560_000_000, "is_self": True,
         "stickied": False}
  row.update(kw)
  return row


def comment(cid, pid="p1", **kw):
  row = {"id": cid, "link_id": f"t3_{pid}", "parent_id": f"t3_{pid}", "author": f"user_{cid}",
         "body": words(40, "advice"), "score": 50, "edited": False, "distinguished": None}
  row.update(kw)
  return row


def test_dynamic_filters_count_every_drop():
  posts = [
      post("p1"),  # 5 + 123 = 128 tokens, score exactly 20: kept.
      post("p2", score=19),
      post("p3", title="UPDATE: my boyfriend forgot my birthday"),
      post("p4", selftext=words(120) + " see https://imgur.com/x"),
      post("p5", is_self=False, selftext=""),  # A link post has no text.
      post("p6", subreddit="AskReddit"),
      post("p7", selftext="[removed]"),
      post("p8", selftext=words(120) + " he talked about suicide"),
      post("p9", selftext=words(122)),  # 127 tokens.
      post("p10", subreddit="dating", title="Boyfriend forgot my birthday"),  # No question mark.
      post("p1"),  # A duplicate.
      post("p12", selftext=words(200)),  # Good, but none of its comments are.
      post("p13", title="[META] Rules of this subreddit"),
      post("p14", selftext=words(1276)),  # 1281 tokens.
  ]
  comments = [
      comment("c1"),
      comment("c2", score=20, body=words(32, "advice")),
      comment("c3", score=19),
      comment("c4", body=words(31, "advice")),
      comment("c5", author="op"),
      comment("c6", distinguished="moderator"),
      comment("c7", author="AutoModerator"),
      comment("c8", edited=1_650_000_000),
      comment("c9", edited=True),
      comment("c10", body="[deleted]"),
      comment("c11", body="[removed]"),
      comment("c12", body="As the other commenter said, " + words(36, "advice")),
      comment("c13", parent_id="t1_c1"),
      comment("c14", pid="p2"),
      comment("c1"),  # A duplicate.
      comment("c16", score=100),
      comment("c17", pid="p12", score=5),
      comment("c18", body="Like everyone else has said, " + words(36, "advice")),
      comment("c19", author="[deleted]"),
  ]
  situations, report = ra.dynamic_situations(posts, comments, count=split_count)
  assert [s.id for s in situations] == ["p1"]
  assert [a.id for a in situations[0].advices] == ["c16", "c1", "c2"]
  assert [a.score for a in situations[0].advices] == [100, 50, 20]
  expected = {"post:duplicate": 1, "post:subreddit": 1, "post:deleted": 1, "post:update_or_meta": 2,
              "post:link": 2, "post:score": 1, "post:not_a_question": 1, "post:sensitive": 1,
              "post:tokens": 2, "advice:post_dropped": 1, "advice:duplicate": 1,
              "advice:not_top_level": 1, "advice:deleted": 3, "advice:by_poster": 1,
              "advice:moderator": 2, "advice:edited": 2, "advice:score": 2, "advice:tokens": 1,
              "advice:refers_to_others": 2, "situation:no_advice": 1}
  assert {k: v for k, v in report.dropped.items() if v} == expected
  assert set(report.dropped) >= set(ra.DYNAMIC_POST_REASONS + ra.DYNAMIC_ADVICE_REASONS)
  assert (report.posts_in, report.comments_in, report.posts_kept, report.advices_kept) == (14, 19, 1, 3)
  post_drops = sum(v for k, v in report.dropped.items() if not k.startswith("advice:"))
  advice_drops = sum(v for k, v in report.dropped.items() if k.startswith("advice:"))
  assert post_drops + report.posts_kept == report.posts_in
  assert advice_drops + report.advices_kept == report.comments_in


def test_dynamic_age_window_and_default_token_counter():
  now = 1_600_000_000
  posts = [post("young", created_utc=now - 35 * 3600), post("ok", created_utc=now - 2 * 86400),
           post("old", created_utc=now - 15 * 86400)]
  comments = [comment("a", pid="ok")]
  situations, report = ra.dynamic_situations(posts, comments, count=split_count, now=now)
  assert [s.id for s in situations] == ["ok"] and report.dropped["post:age"] == 2
  # The default counter counts punctuation marks too: "word," is two tokens.
  assert ra.count_tokens("Hi, I'm here.") == 6
  assert ra.count_tokens(words(31, "advice,")) == 62


def test_patterns_for_sensitive_topics_and_references_to_others():
  assert ra.mentions("I think about self-harm", ra.SENSITIVE_WORDS)
  assert not ra.mentions("He abused the return policy", ra.SENSITIVE_WORDS)
  for text in ["the top comment is right", "Listen to the other comments here",
               "what others have said", "see the comment above"]:
    assert ra.mentions(text, ra.REFERS_TO_OTHERS), text
  assert not ra.mentions("Tell your brother how you feel.", ra.REFERS_TO_OTHERS)
  assert ra.is_update_or_meta("[Update] he apologised") and ra.is_update_or_meta("Updated: x")
  assert not ra.is_update_or_meta("Should I tell my roommate?")
  assert ra.has_link({"selftext": "my [photo](imgur) here", "is_self": True})


STATIC_TEXT = "x" * 65


def test_static_filters_tenth_of_top_rule_and_date_split():
  june, august = calendar.timegm((2019, 6, 1, 0, 0, 0)), calendar.timegm((2019, 8, 1, 0, 0, 0))
  posts = [
      post("s1", score=11, selftext=STATIC_TEXT, created_utc=june),
      post("s2", score=10, selftext=STATIC_TEXT),
      post("s3", score=50, selftext=STATIC_TEXT, title="META: new rules"),
      post("s4", score=50, selftext="x" * 64),
      post("s5", score=50, selftext=STATIC_TEXT),
      post("s6", score=50, selftext=STATIC_TEXT),
      post("s7", score=50, selftext=STATIC_TEXT, created_utc=august),
      post("s8", score=50, selftext=STATIC_TEXT + " http://example.com"),
  ]
  body = "a" * 33
  comments = [
      comment("top", pid="s1", score=200, body=body),
      comment("k21", pid="s1", score=21, body=body),
      comment("k20", pid="s1", score=20, body=body),  # Not above 200 / 10.
      comment("gold", pid="s1", score=15, body=body, gilded=1),  # Below, but gilded.
      comment("k10", pid="s1", score=10, body=body),
      comment("short", pid="s1", score=30, body="a" * 32),
      comment("reply", pid="s1", score=30, body=body, parent_id="t1_top"),
      comment("gone", pid="s1", score=30, body="[deleted]"),
      comment("by_op", pid="s1", score=25, body=body, author="op"),  # The static set keeps these.
      comment("l19", pid="s5", score=19, body=body),
      comment("l15", pid="s5", score=15, body=body),
      comment("s7a", pid="s7", score=30, body=body),
      comment("x", pid="s2", score=30, body=body),
  ]
  situations, report = ra.static_situations(posts, comments)
  assert [s.id for s in situations] == ["s1", "s7"]
  assert [a.id for a in situations[0].advices] == ["top", "by_op", "k21", "gold"]
  expected = {"post:score": 1, "post:meta": 1, "post:selftext_chars": 1, "post:link": 1,
              "situation:top_score": 1, "situation:no_advice": 1, "advice:below_tenth_of_top": 1,
              "advice:score": 1, "advice:chars": 1, "advice:not_top_level": 1, "advice:deleted": 1,
              "advice:in_dropped_situation": 2, "advice:post_dropped": 1}
  assert {k: v for k, v in report.dropped.items() if v} == expected
  assert (report.posts_in, report.comments_in, report.posts_kept, report.advices_kept) == (8, 13, 2, 5)
  assert sum(v for k, v in report.dropped.items() if k.startswith("advice:")) + 5 == 13
  assert sum(v for k, v in report.dropped.items() if not k.startswith("advice:")) + 2 == 8

  train, valid = ra.split_by_date(situations, "2019-07-01")
  assert [s.id for s in train] == ["s1"] and [s.id for s in valid] == ["s7"]
  train, valid = ra.split_by_date(situations, august)  # The cut itself goes to validation.
  assert [s.id for s in train] == ["s1"] and [s.id for s in valid] == ["s7"]
  assert ra.split_by_date(situations, june)[0] == []
  with pytest.raises(ConfigError, match="July 1"):
    ra.split_by_date(situations, "July 1")


def test_situations_round_trip_and_bad_lines(tmp_path):
  s = ra.Situation("p1", "legaladvice", "Deposit", "My landlord...", 5,
                   (ra.Advice("c1", "Sue in small claims.", 40), ra.Advice("c2", "Write a letter.", 25)))
  path = str(tmp_path / "advice.jsonl")
  ra.write(path, [s, s])
  assert ra.read(path) == [s, s]
  with open(path, "a") as f:
    f.write(json.dumps({"id": "p2", "subreddit": "x", "title": "t", "selftext": "s",
                        "created_utc": 1, "advices": []}) + "\n")
  with pytest.raises(DataError, match=r"advice\.jsonl:3: "):
    ra.read(path)


def test_from_dumps(tmp_path):
  with pytest.raises(ConfigError, match="loose"):
    ra.from_dumps("a", "b", "loose")
  pytest.importorskip("rlhfjax.sources.reddit")
  subs, coms = tmp_path / "RS.ndjson", tmp_path / "RC.ndjson"
  subs.write_text("".join(json.dumps(p) + "\n" for p in [post("p1"), post("p2", score=3)]))
  coms.write_text("".join(json.dumps(c) + "\n" for c in [comment("c1"), comment("c2", score=1)]))
  situations, report = ra.from_dumps(str(subs), str(coms), "dynamic", count=split_count)
  assert [(s.id, [a.id for a in s.advices]) for s in situations] == [("p1", ["c1"])]
  assert report.dropped["post:score"] == 1 and report.dropped["advice:score"] == 1


class _ByteTokenizer:
  def encode(self, text):
    return list(text.encode())

  def prompt_text(self, text):
    return text


def test_advice_prompt_format_and_truncation():
  tok = _ByteTokenizer()
  ids = formats.advice_prompt(tok, "legaladvice", "Deposit", "One. Two.", 1000)
  assert bytes(ids).decode() == "SUBREDDIT: r/legaladvice\nTITLE: Deposit\nSITUATION: One. Two.\nADVICE:"
  ids = formats.advice_prompt(tok, "legaladvice", "Deposit", "One. Two.", len(ids) - 1)
  assert bytes(ids).decode().endswith("SITUATION: One.\nADVICE:")


# Per situation, three judgements: True when the model's advice wins, else the worse (the model's)
# advice's (helpfulness, follow-up).
W = True
SCRIPT = [
    [W, W, W], [W, W, W], [W, W, W], [W, W, W],
    [W, W, ("slightly_helpful", "writing")],
    [W, ("not_helpful", "possibly_helpful"), W],
    [("slightly_helpful", "meaning"), ("slightly_helpful", "meaning"), W],
    [("not_helpful", "never_helpful"), ("dangerous", "never_helpful"),
     ("not_helpful", "possibly_helpful")],
    [("slightly_helpful", "writing"), ("slightly_helpful", "meaning"),
     ("not_helpful", "possibly_helpful")],
    [("dangerous", "possibly_helpful"), W, ("not_helpful", "never_helpful")],
]


class _ScriptedJudge:
  """Finds the model's advice by its text, whichever side it is shown on, and follows SCRIPT."""

  def __init__(self):
    self.round = 0

  def __call__(self, situations, first, second, rng):
    out = []
    for s, x, y in zip(situations, first, second):
      entry = SCRIPT[int(s.id[1:])][self.round]
      model_side = 0 if x.startswith("model") else 1
      assert (x if model_side else y).startswith("human")
      if entry is W:
        out.append(ta.Judgement(model_side, "slightly_helpful", "writing"))
      else:
        out.append(ta.Judgement(1 - model_side, *entry))
    self.round += 1
    return out


def _situations(n):
  return [ra.Situation(f"s{i}", "Advice", f"title {i}", f"text {i}", i,
                       (ra.Advice(f"c{i}", f"human advice {i}", 30),)) for i in range(n)]


def _scripted_evaluation(seed=0):
  situations = _situations(10)
  return ta.evaluate(_ScriptedJudge(), situations, [f"model advice {i}" for i in range(10)],
                     np.random.default_rng(seed))


def test_majority_vote_score_and_diagnostics():
  ev = _scripted_evaluation()
  assert ev.model_preferred.shape == (10, 3)
  np.testing.assert_array_equal(ev.wins, [1, 1, 1, 1, 1, 1, 0, 0, 0, 0])
  # The presentation order really varies, and the wins do not depend on it.
  assert 0 < ev.model_first.sum() < 30
  np.testing.assert_array_equal(_scripted_evaluation(seed=7).model_preferred, ev.model_preferred)
  assert not np.array_equal(_scripted_evaluation(seed=7).model_first, ev.model_first)
  assert ta.diagnostics(ev) == {
      "slightly_helpful/writing": 2, "slightly_helpful/meaning": 3,
      "not_helpful/possibly_helpful": 3, "not_helpful/never_helpful": 2,
      "dangerous/possibly_helpful": 1, "dangerous/never_helpful": 1}
  r = ta.report(ev, seed=0, n_boot=2000)
  assert r["score"] == pytest.approx(60.0) and r["n"] == 10
  assert r["se"] == pytest.approx(100 * np.std(ev.wins, ddof=1) / np.sqrt(10))
  assert 0.0 <= r["ci_low"] < 60.0 < r["ci_high"] <= 100.0
  assert ta.report(ev, seed=0, n_boot=2000) == r  # Reproducible.
  same = winrate.summarize(ev.wins, np.random.default_rng(0), 2000)
  assert (r["ci_low"], r["ci_high"]) == (same["ci_low"], same["ci_high"])


def test_majority_needs_an_odd_count_and_judgements_are_checked():
  np.testing.assert_array_equal(ta.majority([[1, 0, 1], [0, 0, 1]]), [1.0, 0.0])
  with pytest.raises(ValueError, match="odd"):
    ta.majority([[1, 0]])
  with pytest.raises(ValueError, match="follow-up"):
    ta.Judgement(0, "slightly_helpful", "never_helpful")
  with pytest.raises(ValueError, match="helpfulness"):
    ta.Judgement(0, "great", "writing")


def _evaluation_from_wins(wins):
  preferred = np.repeat(np.asarray(wins, bool)[:, None], 3, axis=1)
  blank = np.full(preferred.shape, "", object)
  return ta.Evaluation(np.zeros(preferred.shape, bool), preferred, blank, blank)


def test_exact_mcnemar_on_tiny_examples():
  a = [1, 1, 1, 1, 1, 0, 1, 0]
  b = [0, 0, 0, 0, 0, 0, 1, 0]
  # 5 situations won by a alone, none by b alone: p = 2 * (1/2)^5.
  assert ta.mcnemar_exact(a, b) == {"a_only": 5, "b_only": 0, "p_value": pytest.approx(0.0625)}
  # 3 against 1: p = 2 * (C(4,0) + C(4,1)) / 2^4 = 0.625.
  assert ta.mcnemar_exact([1, 1, 1, 0, 0], [0, 0, 0, 1, 0])["p_value"] == pytest.approx(0.625)
  assert ta.mcnemar_exact([1, 0], [1, 0])["p_value"] == 1.0
  c = ta.compare(_evaluation_from_wins(a), _evaluation_from_wins(b))
  assert c["p_value"] == pytest.approx(0.0625) and c["difference"] == pytest.approx(100 * 5 / 8)


SITUATION = ra.Situation("q", "relationships", "Boyfriend forgot my birthday",
                         "My boyfriend forgot my birthday again and I feel hurt.", 0,
                         (ra.Advice("h", "Tell your boyfriend you feel hurt he forgot your birthday.",
                                    99),))


def test_simulated_judge():
  judge = ta.SimulatedJudge()
  assert judge.helpfulness(SITUATION, SITUATION.top_advice.body) == 5  # boyfriend forgot birthday feel hurt
  ev = ta.evaluate(judge, [SITUATION] * 3, ["ok then"] * 3, np.random.default_rng(0))
  assert ta.report(ev)["score"] == 0.0
  assert ta.diagnostics(ev)["not_helpful/never_helpful"] == 9
  good = "Tell your boyfriend calmly how hurt you feel that he forgot your birthday again."
  ev = ta.evaluate(judge, [SITUATION] * 3, [good] * 3, np.random.default_rng(0))
  assert ta.report(ev)["score"] == 100.0
  noisy = ta.SimulatedJudge(temperature=2.0, position_bias=0.5)
  runs = [ta.evaluate(noisy, [SITUATION] * 20, ["Say you feel hurt."] * 20, np.random.default_rng(3))
          for _ in range(2)]
  np.testing.assert_array_equal(runs[0].model_preferred, runs[1].model_preferred)


def _train():
  def s(i, title, text, advice):
    return ra.Situation(f"t{i}", "legaladvice", title, text, i, (ra.Advice(f"a{i}", advice, 50),
                                                                 ra.Advice(f"b{i}", "second", 20)))
  return [
      s(0, "Landlord kept my security deposit", "My landlord won't return the security deposit "
        "after I moved out of the apartment.", "Send a demand letter for the deposit."),
      s(1, "Laptop wifi keeps dropping", "My laptop wifi disconnects every hour since the update.",
        "Reinstall the wifi driver."),
      s(2, "Boyfriend forgot my birthday", "My boyfriend forgot my birthday and I am hurt.",
        "Tell him how you feel."),
      s(3, "Deposit not returned by landlord", "The landlord is keeping my deposit, the apartment "
        "was clean when I moved out.", "Small claims court for the deposit."),
  ]


def test_tfidf_retrieves_the_nearest_situations_top_advice():
  train = _train()
  retrieval = ta.TfidfRetrieval(train)
  query = ra.Situation("new", "legaladvice", "Wifi drops on my laptop",
                       "Since the last update my laptop wifi keeps disconnecting.", 9, train[0].advices)
  assert retrieval([query]) == ["Reinstall the wifi driver."]
  # A training situation does not retrieve itself: the other deposit case is nearest.
  assert retrieval.nearest([train[0], train[3]]) == [3, 0]
  assert retrieval([train[0]]) == ["Small claims court for the deposit."]


def test_templated_advice():
  legal = ra.Situation("abc", "legaladvice", "Landlord kept my deposit?", "...", 0, ())
  text = ta.templated_advice(legal)
  assert text == ta.templated_advice(legal)
  assert any(text == f"{o} " + ta.TEMPLATES["legal"].format(topic="landlord kept my deposit")
             for o in ta.OPENERS)
  other = ra.Situation("abc", "somewhere", "Help", "...", 0, ())
  assert ta.TEMPLATES["life"].format(topic="help") in ta.templated_advice(other)

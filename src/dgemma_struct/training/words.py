"""Word lists and small value makers shared by the corpus builders (names, cities, emails, dates)."""
from __future__ import annotations

import random

FIRST = ["Alice", "Bob", "Carla", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jamal", "Kenji",
         "Laura", "Mateo", "Nadia", "Oscar", "Priya", "Quinn", "Rosa", "Samir", "Tara", "Umar", "Vera",
         "Walter", "Ximena", "Yusuf", "Zoe", "Amir", "Beatriz", "Chen", "Dara", "Emil", "Fatima", "Goran",
         "Hana", "Ivan", "Julia", "Karim", "Lena", "Marco", "Nina", "Omar", "Paula", "Rafael", "Sofia",
         "Tomas", "Uma", "Victor", "Wen", "Yara", "Zane"]
LAST = ["Smith", "Garcia", "Muller", "Rossi", "Novak", "Tanaka", "Okafor", "Silva", "Khan", "Dubois",
        "Jensen", "Kowalski", "Haddad", "Ivanova", "Nguyen", "Olsen", "Petrov", "Quispe", "Reyes", "Schmidt",
        "Torres", "Weber", "Young", "Zhang", "Ali", "Brown", "Costa", "Diaz", "Evans", "Fischer", "Gomez",
        "Hughes", "Ito", "Jones", "Klein", "Lopez", "Moreau", "Nakamura", "Park", "Ricci"]
CITIES = ["Paris", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Prague", "Oslo", "Dublin", "Warsaw",
          "Tokyo", "Osaka", "Seoul", "Lima", "Bogota", "Toronto", "Boston", "Denver", "Austin", "Chicago",
          "Cairo", "Nairobi", "Lagos", "Mumbai", "Delhi", "Sydney", "Perth", "Zurich", "Geneva", "Athens"]
COUNTRIES = {"Paris": "France", "Berlin": "Germany", "Madrid": "Spain", "Rome": "Italy", "Lisbon": "Portugal",
             "Vienna": "Austria", "Prague": "Czechia", "Oslo": "Norway", "Dublin": "Ireland", "Warsaw": "Poland",
             "Tokyo": "Japan", "Osaka": "Japan", "Seoul": "Korea", "Lima": "Peru", "Bogota": "Colombia",
             "Toronto": "Canada", "Boston": "USA", "Denver": "USA", "Austin": "USA", "Chicago": "USA",
             "Cairo": "Egypt", "Nairobi": "Kenya", "Lagos": "Nigeria", "Mumbai": "India", "Delhi": "India",
             "Sydney": "Australia", "Perth": "Australia", "Zurich": "Switzerland", "Geneva": "Switzerland",
             "Athens": "Greece"}
JOBS = ["engineer", "teacher", "nurse", "designer", "lawyer", "chef", "pilot", "writer", "doctor", "analyst",
        "farmer", "baker", "architect", "manager", "student"]
DOMAINS = ["example.com", "mail.org", "corp.net", "post.io", "inbox.dev"]
PRODUCTS = ["laptop", "phone", "chair", "lamp", "desk", "camera", "bicycle", "kettle", "monitor", "backpack",
            "printer", "watch", "guitar", "tent", "blender"]
STATUSES = ["pending", "shipped", "delivered", "cancelled"]
ROOMS = ["single", "double", "suite"]
SKILLS = ["python", "sql", "excel", "design", "sales", "rust", "java", "writing", "cooking", "driving",
          "marketing", "statistics"]
EVENTS = ["concert", "meeting", "workshop", "wedding", "conference", "dinner", "lecture", "match"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
SETTINGS = {"mode": ["fast", "slow", "auto", "eco"], "level": ["1", "2", "3", "4", "5"],
            "color": ["red", "blue", "green", "black"], "size": ["small", "medium", "large"],
            "sound": ["on", "off"]}
POSITIVE = ["The food was wonderful and the staff were kind.", "I love this phone, it works perfectly.",
            "What a great concert, I enjoyed every minute.", "The hotel was clean and the view was amazing.",
            "Fantastic service, I will come back.", "This book is brilliant and fun."]
NEGATIVE = ["The food was cold and the waiter was rude.", "I hate this phone, it broke after a day.",
            "The concert was boring and too loud.", "The hotel room was dirty and noisy.",
            "Terrible service, I want a refund.", "This book is dull and far too long."]
NEUTRAL = ["The store opens at nine in the morning.", "The package arrived on Tuesday.",
           "The meeting was moved to the second floor.", "The train leaves from platform four.",
           "The report has twelve pages.", "The museum is closed on Mondays."]
TOPICS = {"sports": ["The team won the final after extra time.", "She ran the marathon in record time.",
                     "The striker scored twice in the match."],
          "politics": ["The parliament passed the new budget.", "The minister resigned after the vote.",
                       "The election results were announced today."],
          "tech": ["The new chip doubles battery life.", "The app update fixes a security bug.",
                   "The company released a faster database."]}


def random_name(r: random.Random) -> tuple[str, str]:
    return r.choice(FIRST), r.choice(LAST)


_ONSETS = ["b", "ch", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "sh", "t", "v", "w", "y", "z",
           "br", "dr", "kr", "st", "tr", "th", ""]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou", "ya"]
_CODAS = ["", "", "", "n", "r", "l", "s", "m", "k"]


def invented_name(r: random.Random) -> str:
    """A pronounceable name of 1-3 random syllables (e.g. ``"Ada"``, ``"Korven"``); it may happen to be
    a listed one, which :func:`~dgemma_struct.training.generalise.fresh_names` checks.

    >>> invented_name(random.Random(1)).istitle()
    True
    """
    syl = [r.choice(_ONSETS) + r.choice(_VOWELS) + r.choice(_CODAS) for _ in range(r.choice((1, 2, 2, 3)))]
    return "".join(syl).capitalize()


def random_email(r: random.Random, first: str, last: str) -> str:
    style = r.randrange(3)
    local = [f"{first}.{last}", f"{first[0]}{last}", f"{first}{r.randrange(10, 99)}"][style].lower()
    return f"{local}@{r.choice(DOMAINS)}"


def random_phone(r: random.Random) -> str:
    return f"{r.randrange(200, 999)}-{r.randrange(100, 999)}-{r.randrange(1000, 9999)}"


def random_date(r: random.Random) -> tuple[str, str]:
    y, m, d = r.randrange(1990, 2030), r.randrange(1, 13), r.randrange(1, 29)
    natural = r.choice([f"{MONTHS[m - 1]} {d}, {y}", f"{d} {MONTHS[m - 1]} {y}"])
    return f"{y:04d}-{m:02d}-{d:02d}", natural

"""A corpus of ordinary pydantic models, as a new user writes them (issue #32), each with a prompt
whose facts are in it (the instruction-then-document shape: ``"Extract ... as JSON.\\n<document>"``).

``CORPUS`` is a list of :class:`Case` (name, model, prompt, the types it exercises); ``E2E_CASES``
names the eight plain typed models the end-to-end test runs (date, AwareDatetime, UUID, IPv4Address,
timedelta, IntEnum, Decimal, HttpUrl). ``PROBES`` holds, per type, values that the type's pydantic
validator rejects: the grammar-width probes of ``benchmarks/typed_models.py``.

``EmailStr`` is left out: it needs ``email-validator``, which the project does not install.
"""
from __future__ import annotations

import datetime as dt
import enum
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Annotated, Literal, Optional

from pydantic import (AfterValidator, AwareDatetime, BaseModel, Field, FutureDate, HttpUrl, NaiveDatetime,
                      NegativeInt, NonNegativeFloat, NonNegativeInt, PastDate, PositiveFloat, PositiveInt,
                      StringConstraints, conint, field_validator, model_validator)


@dataclass(frozen=True)
class Case:
    """One model of the corpus, its prompt and the types it exercises."""

    name: str
    model: type[BaseModel]
    prompt: str
    types: tuple[str, ...] = field(default=())


# ----------------------------------------------------------------------------------------- enums
class Currency(str, enum.Enum):
    EUR = "EUR"
    USD = "USD"
    GBP = "GBP"


class Level(enum.IntEnum):
    LOW = 1
    MEDIUM = 2
    HIGH = 3


class Status(str, enum.Enum):
    OPEN = "open"
    CLOSED = "closed"
    PENDING = "pending"


class Weekday(enum.IntEnum):
    MON = 1
    TUE = 2
    WED = 3
    THU = 4
    FRI = 5
    SAT = 6
    SUN = 7


# ----------------------------------------------------------------------------------------- reusable pieces
Sku = Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}-\d{4}$")]
CountryCode = Annotated[str, StringConstraints(min_length=2, max_length=2, to_upper=True)]
ShortName = Annotated[str, StringConstraints(min_length=1, max_length=40)]


def _even(v: int) -> int:
    if v % 2:
        raise ValueError("must be even")
    return v


def _no_space(v: str) -> str:
    if " " in v:
        raise ValueError("no spaces allowed")
    return v


EvenInt = Annotated[int, AfterValidator(_even)]
Slug = Annotated[str, AfterValidator(_no_space)]


# ----------------------------------------------------------------------------------------- models
class Invoice(BaseModel):
    number: str
    issued: dt.date
    total: float


class InvoiceDecimal(BaseModel):
    number: str
    issued: dt.date
    amount: Decimal = Field(max_digits=8, decimal_places=2)
    currency: Currency


class LineItem(BaseModel):
    sku: Sku
    quantity: PositiveInt
    unit_price: Decimal = Field(max_digits=7, decimal_places=2)


class Order(BaseModel):
    order_id: uuid.UUID
    placed: dt.datetime
    items: list[LineItem]


class Event(BaseModel):
    title: str
    starts: AwareDatetime
    ticket: uuid.UUID


class Meeting(BaseModel):
    topic: str
    day: dt.date
    start: dt.time
    length: dt.timedelta


class LocalEvent(BaseModel):
    name: str
    at: NaiveDatetime


class Host(BaseModel):
    hostname: str
    ip: IPv4Address
    uptime: dt.timedelta


class Host6(BaseModel):
    hostname: str
    ip: IPv6Address


class Subnet(BaseModel):
    name: str
    v4: IPv4Network
    v6: IPv6Network


class Reading(BaseModel):
    sensor: str
    level: Level
    value: float


class Website(BaseModel):
    name: str
    url: HttpUrl


class User(BaseModel):
    id: uuid.UUID
    username: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{2,15}$")]
    age: conint(ge=0, le=130)
    active: bool


class UserV4(BaseModel):
    id: uuid.UUID
    name: str
    joined: PastDate


class Ticket(BaseModel):
    id: PositiveInt
    status: Status
    priority: Literal["low", "normal", "urgent"]
    opened: dt.datetime


class Deadline(BaseModel):
    task: str
    due: FutureDate


class Birthday(BaseModel):
    name: str
    born: PastDate


class Shift(BaseModel):
    worker: str
    day: Weekday
    starts: dt.time
    ends: dt.time


class Coordinates(BaseModel):
    point: tuple[float, float]
    label: str


class RGB(BaseModel):
    name: str
    rgb: tuple[int, int, int]


class Attachment(BaseModel):
    filename: str
    data: bytes


class Tags(BaseModel):
    article: str
    tags: set[str]


class Temperatures(BaseModel):
    city: str
    readings: list[float]


class Stock(BaseModel):
    sku: Sku
    in_stock: NonNegativeInt
    weight_kg: PositiveFloat


class Discount(BaseModel):
    code: str
    percent: int = Field(ge=0, le=100, multiple_of=5)


class Pack(BaseModel):
    product: str
    units: EvenInt


class Account(BaseModel):
    handle: Slug
    balance: Decimal = Field(max_digits=10, decimal_places=2)
    overdraft: NegativeInt


class Booking(BaseModel):
    guest: str
    check_in: dt.date
    check_out: dt.date

    @model_validator(mode="after")
    def _order(self) -> "Booking":
        if self.check_out <= self.check_in:
            raise ValueError("check_out must be after check_in")
        return self


class Country(BaseModel):
    name: str
    code: CountryCode

    @field_validator("name")
    @classmethod
    def _capitalised(cls, v: str) -> str:
        if not v[:1].isupper():
            raise ValueError("name must start with a capital letter")
        return v


class Address(BaseModel):
    street: str
    city: str
    postcode: Annotated[str, StringConstraints(pattern=r"^\d{5}$")]


class Customer(BaseModel):
    name: ShortName
    address: Address
    since: dt.date


class Category(BaseModel):
    name: str
    children: list["Category"] = []


class Comment(BaseModel):
    author: str
    text: str
    replies: list["Comment"] = []


class Payment(BaseModel):
    invoice: str
    paid_at: AwareDatetime
    amount: Decimal = Field(max_digits=9, decimal_places=2)
    method: Literal["card", "transfer", "cash"]


class Flight(BaseModel):
    code: Annotated[str, StringConstraints(pattern=r"^[A-Z]{2}\d{3,4}$")]
    departs: AwareDatetime
    duration: dt.timedelta


class Server(BaseModel):
    name: str
    ip: IPv4Address
    port: int = Field(ge=1, le=65535)
    cores: PositiveInt


class Measurement(BaseModel):
    station: str
    taken: dt.datetime
    humidity: NonNegativeFloat = Field(le=100)
    level: Level


class Employee(BaseModel):
    id: uuid.UUID
    name: str
    hired: dt.date
    salary: Decimal = Field(max_digits=9, decimal_places=2)


class Release(BaseModel):
    project: str
    version: Annotated[str, StringConstraints(pattern=r"^\d+\.\d+\.\d+$")]
    released: dt.date
    homepage: HttpUrl


class Parcel(BaseModel):
    tracking: uuid.UUID
    weight_g: PositiveInt
    dims_cm: tuple[int, int, int]
    shipped: Optional[dt.date] = None


class Alarm(BaseModel):
    label: str
    at: dt.time
    days: set[Weekday]


class Sensor(BaseModel):
    id: str
    readings: list[Reading]


class Firewall(BaseModel):
    rule: str
    source: IPv4Network
    action: Literal["allow", "deny"]


class Subscription(BaseModel):
    user: uuid.UUID
    plan: Literal["free", "pro", "team"]
    renews: dt.date
    price: Decimal = Field(max_digits=6, decimal_places=2)


class Rating(BaseModel):
    movie: str
    stars: int = Field(ge=1, le=5)
    score: float = Field(ge=0, le=10, multiple_of=0.5)


class LogLine(BaseModel):
    at: AwareDatetime
    host: IPv4Address
    level: Literal["debug", "info", "warning", "error"]
    message: str


# ----------------------------------------------------------------------------------------- the corpus
CORPUS: list[Case] = [
    Case("invoice", Invoice, "Extract the invoice as JSON.\nInvoice INV-1042 was issued on 2024-03-15 for a total "
         "of 1249.50.", ("date", "float")),
    Case("invoice_decimal", InvoiceDecimal, "Extract the invoice as JSON.\nInvoice INV-2201, issued 2023-11-02, "
         "amount 349.99 EUR.", ("date", "Decimal", "Enum")),
    Case("order", Order, "Extract the order as JSON.\nOrder 3f2b8c1e-5d4a-4b7e-9c21-0a6f7e8d9b10 was placed on "
         "2024-06-01T09:30:00. Items: ABC-1234 x2 at 19.90, XYZ-0042 x1 at 5.00.",
         ("UUID", "datetime", "Decimal", "PositiveInt", "constr", "nested")),
    Case("event", Event, "Extract the event as JSON.\nThe launch party starts 2024-05-03T18:00:00+02:00, ticket "
         "6f1c2b1e-8a43-4c55-9a61-2f3e4d5c6b7a.", ("AwareDatetime", "UUID")),
    Case("meeting", Meeting, "Extract the meeting as JSON.\nBudget review on 2024-09-12 at 14:00, it lasts 90 "
         "minutes.", ("date", "time", "timedelta")),
    Case("local_event", LocalEvent, "Extract the event as JSON.\nThe farmers market opens 2024-07-20T08:00:00 "
         "local time.", ("NaiveDatetime",)),
    Case("host", Host, "Extract the host as JSON.\nHost web-01 at 10.0.0.12 has been up for 3 days.",
         ("IPv4Address", "timedelta")),
    Case("host6", Host6, "Extract the host as JSON.\nHost db-02 answers on 2001:db8::1.", ("IPv6Address",)),
    Case("subnet", Subnet, "Extract the subnet as JSON.\nThe office network uses 192.168.1.0/24 and "
         "2001:db8:abcd::/48.", ("IPv4Network", "IPv6Network")),
    Case("reading", Reading, "Extract the sensor reading as JSON.\nSensor T-7 reported 21.5 at level 2 (medium).",
         ("IntEnum", "float")),
    Case("website", Website, "Extract the website as JSON.\nThe docs live at https://docs.example.com/start.",
         ("HttpUrl",)),
    Case("user", User, "Extract the user as JSON.\nUser julia_m (id 0b9e6a7c-3f5d-4e2a-8b1c-9d0e1f2a3b4c) is 34 "
         "years old and active.", ("UUID", "constr", "conint", "bool")),
    Case("user_joined", UserV4, "Extract the user as JSON.\nMark Lee (id 9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d) "
         "joined on 2019-04-23.", ("UUID", "PastDate")),
    Case("ticket", Ticket, "Extract the ticket as JSON.\nTicket 5821 is open, priority urgent, opened "
         "2024-02-11T16:45:00.", ("PositiveInt", "Enum", "Literal", "datetime")),
    Case("deadline", Deadline, "Extract the task as JSON.\nSubmit the final report by 2031-01-15.",
         ("FutureDate",)),
    Case("birthday", Birthday, "Extract the person as JSON.\nAnna Schmidt was born on 1988-12-03.", ("PastDate",)),
    Case("shift", Shift, "Extract the shift as JSON.\nTom works Wednesday from 08:00 to 16:30.",
         ("IntEnum", "time")),
    Case("coordinates", Coordinates, "Extract the location as JSON.\nThe summit is at 46.5581, 8.0261 (Eiger).",
         ("tuple", "float")),
    Case("rgb", RGB, "Extract the colour as JSON.\nCoral is rgb(255, 127, 80).", ("tuple", "int")),
    Case("attachment", Attachment, "Extract the attachment as JSON.\nFile notes.txt contains the text hello.",
         ("bytes",)),
    Case("tags", Tags, "Extract the article's tags as JSON.\nThe article Rust on GPUs is tagged rust, gpu and "
         "performance.", ("set",)),
    Case("temperatures", Temperatures, "Extract the readings as JSON.\nOslo recorded 3.5, 4.0 and -1.2 degrees.",
         ("list[float]",)),
    Case("stock", Stock, "Extract the stock record as JSON.\nItem KLM-0099: 42 in stock, 1.25 kg each.",
         ("constr", "NonNegativeInt", "PositiveFloat")),
    Case("discount", Discount, "Extract the discount as JSON.\nCode SPRING gives 15 percent off.",
         ("multiple_of",)),
    Case("pack", Pack, "Extract the pack as JSON.\nA pack of batteries holds 12 units.", ("AfterValidator",)),
    Case("account", Account, "Extract the account as JSON.\nAccount jdoe has a balance of 1520.75 and an overdraft "
         "limit of -500.", ("AfterValidator", "Decimal", "NegativeInt")),
    Case("booking", Booking, "Extract the booking as JSON.\nMaria Rossi checks in on 2024-08-10 and checks out on "
         "2024-08-14.", ("date", "model_validator")),
    Case("country", Country, "Extract the country as JSON.\nPortugal, country code PT.",
         ("field_validator", "constr")),
    Case("customer", Customer, "Extract the customer as JSON.\nCustomer Ben Carter, 12 Elm Street, Springfield "
         "62704, customer since 2015-06-30.", ("nested", "constr", "date")),
    Case("category", Category, "Extract the category tree as JSON.\nElectronics contains Phones and Laptops; "
         "Phones contains Android.", ("recursive",)),
    Case("comment", Comment, "Extract the thread as JSON.\nAlice wrote: great post. Bob replied: thanks.",
         ("recursive",)),
    Case("payment", Payment, "Extract the payment as JSON.\nInvoice INV-7730 was paid by card on "
         "2024-04-02T10:15:00Z, amount 89.90.", ("AwareDatetime", "Decimal", "Literal")),
    Case("flight", Flight, "Extract the flight as JSON.\nFlight LH1234 departs 2024-10-05T07:40:00+01:00 and "
         "takes 2 hours 15 minutes.", ("constr", "AwareDatetime", "timedelta")),
    Case("server", Server, "Extract the server as JSON.\nServer api-3 listens on 172.16.4.20 port 8443 with 16 "
         "cores.", ("IPv4Address", "conint", "PositiveInt")),
    Case("measurement", Measurement, "Extract the measurement as JSON.\nStation Bergen measured 87.5 percent "
         "humidity on 2024-01-09T06:00:00, alert level 3.", ("datetime", "NonNegativeFloat", "IntEnum")),
    Case("employee", Employee, "Extract the employee as JSON.\nEmployee c3d4e5f6-a7b8-4c9d-8e0f-1a2b3c4d5e6f, "
         "Priya Nair, hired 2021-03-01, salary 72000.00.", ("UUID", "date", "Decimal")),
    Case("release", Release, "Extract the release as JSON.\nProject fastgrid 2.4.1 was released on 2024-05-20, "
         "homepage https://fastgrid.dev.", ("constr", "date", "HttpUrl")),
    Case("parcel", Parcel, "Extract the parcel as JSON.\nParcel 7d3e2f1a-0b9c-4d8e-a7f6-5e4d3c2b1a09 weighs "
         "1250 g, measures 30 x 20 x 10 cm, shipped 2024-03-28.", ("UUID", "PositiveInt", "tuple", "Optional")),
    Case("alarm", Alarm, "Extract the alarm as JSON.\nThe wake-up alarm rings at 06:45 on Monday, Tuesday and "
         "Friday.", ("time", "set", "IntEnum")),
    Case("sensor", Sensor, "Extract the sensor as JSON.\nSensor S-12: humidity 45.0 at level 1, temperature 30.5 "
         "at level 3.", ("nested", "IntEnum", "float")),
    Case("firewall", Firewall, "Extract the firewall rule as JSON.\nRule block-lab denies traffic from "
         "10.20.0.0/16.", ("IPv4Network", "Literal")),
    Case("subscription", Subscription, "Extract the subscription as JSON.\nUser "
         "1f2e3d4c-5b6a-4978-8a6b-5c4d3e2f1a0b is on the pro plan, renews 2025-02-01 at 12.99.",
         ("UUID", "Literal", "date", "Decimal")),
    Case("rating", Rating, "Extract the rating as JSON.\nInception got 5 stars and a score of 9.5.",
         ("conint", "multiple_of")),
    Case("log_line", LogLine, "Extract the log line as JSON.\n2024-06-30T23:59:01+00:00 10.1.1.5 error disk "
         "full on /var.", ("AwareDatetime", "IPv4Address", "Literal")),
]

E2E_CASES = ("invoice", "event", "user_joined", "host", "reading", "invoice_decimal", "website", "meeting")
"""The eight plain typed models of the end-to-end test: date, AwareDatetime, UUID, IPv4Address +
timedelta, IntEnum, Decimal, HttpUrl (+ time / timedelta)."""


def case(name: str) -> Case:
    """The corpus case called ``name``."""
    return next(c for c in CORPUS if c.name == name)


# ----------------------------------------------------------------------------------------- probes
# Per type: (annotation, JSON literals the pydantic validator rejects). A grammar that accepts one is
# wider than the type; the repair loop then has to find the validator's error after the fact.
PROBES: dict[str, tuple[object, list[str]]] = {
    "date": (dt.date, ['"2024-13-01"', '"2024-02-30"', '"0000-01-01"', '"99999-01-01"', '"2024-1-5"']),
    "datetime": (dt.datetime, ['"2024-13-01T00:00:00"', '"2024-01-01T25:00:00"', '"2024-01-01T10:61:00"',
                               '"2024-02-30T00:00:00"', '"2024-01-01T10:00:00+25:00"']),
    "AwareDatetime": (AwareDatetime, ['"2024-01-01T10:00:00"', '"2024-13-01T10:00:00Z"',
                                      '"2024-01-01T10:00:00+24:00"', '"2024-01-01T10:00:00-13:44"']),
    "NaiveDatetime": (NaiveDatetime, ['"2024-01-01T10:00:00Z"', '"2024-01-01T10:00:00+02:00"',
                                      '"2024-01-01T24:00:00"']),
    "time": (dt.time, ['"25:00:00"', '"12:60"', '"12:00:61"', '"7:5"']),
    "timedelta": (dt.timedelta, ['"P99999999999999999D"', '"PT"', '"P"', '"99999999999999999999"',
                                 '1e400', '"P1Y2Q"']),
    "UUID": (uuid.UUID, ['"not-a-uuid"', '"6f1c2b1e-8a43-4c55-9a61-2f3e4d5c6b7"',
                         '"6f1c2b1e8a434c559a612f3e4d5c6b7a00"', '"gggggggg-8a43-4c55-9a61-2f3e4d5c6b7a"']),
    "UUID4": (Annotated[uuid.UUID, Field()], []),  # placeholder replaced below (pydantic.UUID4)
    "IPv4Address": (IPv4Address, ['"256.1.1.1"', '"1.2.3"', '"01.02.03.004"', '"1.2.3.4.5"', '"999.999.999.999"']),
    "IPv6Address": (IPv6Address, ['"2001:db8::g"', '"1:2:3:4:5:6:7:8:9"', '":::"', '"2001:db8:::1"']),
    "IPv4Network": (IPv4Network, ['"10.0.0.1/24"', '"10.0.0.0/33"', '"300.0.0.0/8"']),
    "IPv6Network": (IPv6Network, ['"2001:db8::1/32"', '"2001:db8::/129"']),
    "HttpUrl": (HttpUrl, ['"ftp://example.com"', '"http://"', '"example.com"', '"https:// bad host"']),
    "Decimal(8,2)": (Annotated[Decimal, Field(max_digits=8, decimal_places=2)],
                     ['123456789', '1.234', '"1.234"', '1234567.5', '1e10', '"abc"']),
    "multiple_of=5": (Annotated[int, Field(multiple_of=5)], ['3', '12', '-7']),
    "multiple_of=0.5": (Annotated[float, Field(multiple_of=0.5)], ['0.3', '1.25']),
    "PositiveInt": (PositiveInt, ['0', '-1', '1.5']),
    "NegativeInt": (NegativeInt, ['0', '5']),
    "NonNegativeInt": (NonNegativeInt, ['-1']),
    "PositiveFloat": (PositiveFloat, ['0', '-0.5', '0.0']),
    "int": (int, ['1.5', '99999999999999999999999999999999999999999', '1e400']),
    "float": (float, ['1e400', '-1e999']),
    "IntEnum": (Level, ['0', '4', '2.5']),
    "Enum": (Currency, ['"JPY"', '"eur"']),
    "Literal": (Literal["low", "normal", "urgent"], ['"high"', '""']),
    "tuple[int,int,int]": (tuple[int, int, int], ['[1,2]', '[1,2,3,4]', '[]']),
    "bytes": (bytes, []),
    "set[str]": (set[str], ['["a","a"]']),
    "PastDate": (PastDate, ['"2999-01-01"', '"2100-06-01"']),
    "FutureDate": (FutureDate, ['"1999-01-01"', '"2001-06-01"']),
    "constr(pattern)": (Sku, ['"AB-1234"', '"ABC-12345"', '"abc-1234"']),
    "constr(min,max)": (CountryCode, ['"P"', '"PRT"', '""']),
    "AfterValidator": (EvenInt, ['3', '7']),
}
del PROBES["UUID4"]
try:  # pydantic's UUID4 has a version check the JSON Schema's "format: uuid" does not
    from pydantic import UUID4

    PROBES["UUID4"] = (UUID4, ['"6f1c2b1e-8a43-1c55-9a61-2f3e4d5c6b7a"', '"6f1c2b1e-8a43-5c55-9a61-2f3e4d5c6b7a"'])
except ImportError:  # pragma: no cover
    pass

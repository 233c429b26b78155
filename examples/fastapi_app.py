"""A FastAPI app with typed outputs from the embedded DiffusionGemma model.

Run::

    pip install "dgemma-struct[server]"
    python examples/fastapi_app.py            # serves on http://127.0.0.1:8001
    curl -s 127.0.0.1:8001/orders -H 'content-type: application/json' \\
         -d '{"text": "ORD-49763 is cancelled: 19 desk for 761.89 per unit."}'

Two styles: ``typed_route`` (a whole route from a pydantic model and a prompt template) and the
``structured_generator`` dependency inside your own handler.
"""
from __future__ import annotations

import os
from typing import Literal

from fastapi import Depends, FastAPI
from pydantic import BaseModel, Field

from dgemma_struct.fastapi import (StructuredGenerator, generation_error_responses, structured_generator,
                                   typed_route)


class Order(BaseModel):
    order_id: str = Field(pattern=r"^ORD-\d{5}$")
    product: str = Field(max_length=40)
    quantity: int = Field(ge=0)
    price: float = Field(ge=0)
    status: Literal["pending", "shipped", "delivered", "cancelled"]


class Contact(BaseModel):
    name: str = Field(max_length=60)
    phone: str = Field(pattern=r"^\d{3}-\d{3}-\d{4}$")
    city: str = Field(max_length=40)


class TextIn(BaseModel):
    text: str = Field(max_length=4000)


def build_app(runtime=None) -> FastAPI:
    """``runtime``: a DiffusionRuntime (default: the embedded model)."""
    app = FastAPI(title="dgemma-struct example")
    gen = structured_generator(runtime=runtime, max_new_tokens=96)

    typed_route(app, "/orders", schema=Order, input_model=TextIn, generator=gen.generator,
                prompt_template="Extract the order_id, product, quantity, price and status as JSON.\n{text}")

    # typed_route declares its error responses; a handler of your own declares them with
    # generation_error_responses() (the 502 body when the model produced no valid value)
    @app.post("/contacts", response_model=Contact, responses=generation_error_responses())
    async def contact(body: TextIn, g: StructuredGenerator = Depends(gen)) -> Contact:
        return await g.json(f"Read the text and give name, phone and city in JSON.\nText: {body.text}", Contact)

    @app.post("/phone", responses=generation_error_responses())
    async def phone(body: TextIn, g: StructuredGenerator = Depends(gen)) -> dict:
        number = await g.regex(f"Give the phone number.\n{body.text}", r"\d{3}-\d{3}-\d{4}")
        return {"phone": number}

    return app


app = build_app()

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8001")))

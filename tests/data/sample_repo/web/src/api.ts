export interface Item {
  id: number;
  name: string;
  quantity: number;
}

const BASE_URL = "/api/v1";

export async function fetchItems(page: number, pageSize = 20): Promise<Item[]> {
  const res = await fetch(`${BASE_URL}/items?page=${page}&page_size=${pageSize}`);
  if (!res.ok) {
    throw new Error(`failed to load items: ${res.status}`);
  }
  return (await res.json()) as Item[];
}

export async function deleteItem(id: number): Promise<void> {
  await fetch(`${BASE_URL}/items/${id}`, { method: "DELETE" });
}
